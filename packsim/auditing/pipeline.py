"""The pipeline under audit: one forward and what it knows about the batch, whatever its format.

A :class:`Pipeline` wraps a PackedBatch (run with ``packsim.core.model.forward``) or a collator dict
(run as ``model(**batch, **kwargs)``): input_ids (B, T), seq (B, T) example index (-1 padding),
roles (B, T), positions (B, T). The objective (:data:`OBJECTIVES`) says what the loss should count:
``"sft"`` (prompts -100) or ``"lm"`` (every real token a target: the roles inside the examples are
all response).

Lessons: none directly (they call packsim.audit, which builds the pipeline).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from packsim.core.batch import PackedBatch
from packsim.core.boundaries import find_boundaries, text_positions
from packsim.core.errors import PacksimError
from packsim.core.loss import Role
from packsim.core.segments import example_positions, run_starts
from packsim.core.special_tokens import is_token, token_ids
from packsim.core.upstream.trl_trainers import logit_fields


@dataclass
class ForwardOutput:
    """What one forward of the audited pipeline gave: logits, the KV cache, attention maps."""

    logits: torch.Tensor  # (B, T, V)
    cache: object = None
    attentions: tuple | None = None
    in_eval: bool = False  # the logits are this forward's in eval mode (run so, or shown equal by the audit)


@dataclass
class Pipeline:
    """Everything the probes need, whatever the batch format.

    run(input_ids=None, inputs_embeds=None, output_attentions=False) -> ForwardOutput runs the pipeline's
    forward with the tokens (or embeddings) replaced. seq (B, T) long: dense example index
    0..S-1, -1 on padding. roles (B, T): packsim Role codes (``Role.UNKNOWN`` where a dict batch
    does not say prompt or response), -1 on each row's first token. run_alone(ids, positions,
    mask) runs right-padded rows (R, L) of single examples through the same model (the
    isolation reference of :mod:`packsim.auditing.packed_vs_alone`).
    """

    model: torch.nn.Module
    run: Callable[..., ForwardOutput]
    input_ids: torch.Tensor
    seq: torch.Tensor
    example_ids: list[int]
    boundaries: str
    labels: torch.Tensor | None
    roles: torch.Tensor
    role_notes: list[str]
    positions: torch.Tensor | None  # (B, T) as the forward gets them; None = model default
    expected_positions: torch.Tensor  # (B, T) positions that restart at each example
    forward: str
    context: dict
    run_alone: Callable[..., torch.Tensor] | None = None  # (ids, positions, mask) (R, L) -> logits (R, L, V)
    objective: str = "sft"  # "sft": prompts are not targets; "lm": every real token is one (OBJECTIVES)


# what the loss should count: the completion-only SFT check (default) or language modelling
OBJECTIVES = {"sft": "completion-only fine-tuning: the prompts' labels are -100, the responses and EOS counted",
              "lm": "language modelling (pretraining style): every real token is a target, no prompt/response "
                    "split; padding and the label across each example boundary are still not counted"}
LM_NOTE = "every real token is a target (objective='lm')"


def check_objective(objective: str, response_mask=None) -> str:
    """``objective`` when it is one of :data:`OBJECTIVES` and fits ``response_mask``; else PacksimError."""
    if objective not in OBJECTIVES:
        raise PacksimError(f"objective={objective!r}: use 'sft' ({OBJECTIVES['sft']}; the default) or 'lm' "
                           f"({OBJECTIVES['lm'].split(':')[0]}: every token a target).")
    if objective == "lm" and response_mask is not None:
        raise PacksimError("objective='lm' makes every real token a target, so a response_mask cannot go with it: "
                           "pass one or the other.")
    return objective


def _objective_mask(objective: str, response_mask, shape):
    """The response mask the objective implies: all True for 'lm' (padding is set apart by the roles)."""
    check_objective(objective, response_mask)
    return torch.ones(tuple(shape), dtype=torch.bool) if objective == "lm" else response_mask


@contextmanager
def same_randomness(seed: int, device: torch.device):
    """Every forward sees the same RNG state, so dropout in train mode cancels out of differences.

    Seeds the CPU generator and the model's CUDA device only: ``torch.manual_seed`` also queues a
    seed for every lazy accelerator module (each with a formatted stack: a cost on every call).
    """
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.default_generator.manual_seed(seed)
        if device.type == "cuda":
            with torch.cuda.device(device):
                torch.cuda.manual_seed(seed)
        elif device.type != "cpu":
            torch.manual_seed(seed)  # another accelerator: seed them all
        yield


def logits_of(out) -> ForwardOutput:
    if isinstance(out, torch.Tensor):
        return ForwardOutput(out)
    logits = getattr(out, "logits", None)
    if logits is None:
        raise PacksimError(
            f"the model returned {type(out).__name__} without .logits: audit a causal LM whose "
            "forward returns logits (B, T, V), e.g. a transformers *ForCausalLM; a forward that "
            "computes its loss from the hidden states (a fused or chunked loss head) may return none "
            "when it gets labels: audit the batch without labels / shift_labels."
        )
    fields = out if isinstance(out, Mapping) else getattr(out, "__dict__", {})  # ModelOutput: a dict
    keys = list(fields.keys())  # not .get("past_key_values"): transformers 5 warns on the old name
    cache = next((fields[k] for k in ("cache", "past_key_values") if k in keys), None)
    return ForwardOutput(logits, cache, fields.get("attentions"))


def _check_response_mask(response_mask, shape) -> torch.Tensor | None:
    if response_mask is None:
        return None
    mask = torch.as_tensor(response_mask)
    if tuple(mask.shape) != tuple(shape):
        raise PacksimError(
            f"response_mask has shape {tuple(mask.shape)} but input_ids has {tuple(shape)}: pass one "
            "bool per token (True on response tokens and EOS)."
        )
    return mask.bool()


def _kwargs_text(forward_kwargs: dict) -> str:
    """', k=v' per forward keyword; a tensor as its shape and dtype (its values would flood the report)."""
    def text(v):
        if isinstance(v, torch.Tensor):
            return f"<tensor {tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}>"
        return repr(v)
    return "".join(f", {k}={text(v)}" for k, v in forward_kwargs.items())


def _dense_ids(ids: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """Relabel example ids (B, T) (-1 = padding) to 0..S-1 in order of value; return the labels."""
    real = ids >= 0
    values, inverse = torch.unique(ids[real], return_inverse=True)
    dense = torch.full_like(ids, -1)
    dense[real] = inverse
    return dense, values.tolist()


# ---------------------------------------------------------------------------- PackedBatch


def packed_pipeline(model, batch: PackedBatch, response_mask, forward_kwargs, objective: str = "sft") -> Pipeline:
    from packsim.core.model import forward

    def run(input_ids=None, inputs_embeds=None, output_attentions=False) -> ForwardOutput:
        b = batch if input_ids is None else _replace_ids(batch, input_ids)
        return ForwardOutput(forward(model, b, inputs_embeds=inputs_embeds, **forward_kwargs))

    found = find_boundaries(batch)
    seq, ids = _dense_ids(found.seq_ids)
    roles, notes = _packed_roles(model, batch, _objective_mask(objective, response_mask, batch.shape))
    if objective == "lm":
        notes[0] = LM_NOTE
    kw = _kwargs_text(forward_kwargs)
    return Pipeline(
        model=model, run=run, input_ids=batch.input_ids, seq=seq, example_ids=ids,
        boundaries=found.source,
        labels=batch.labels, roles=roles, role_notes=notes, positions=batch.position_ids,
        expected_positions=batch.example_positions,
        forward=f"packsim.core.model.forward(model, batch{kw}) under setup {batch.setup.name!r}",
        context={"kind": "packed", "setup": batch.setup, "batch": batch},
        run_alone=lambda x, pos, mask: logits_of(
            model(input_ids=x, position_ids=pos, attention_mask=mask, use_cache=False)).logits,
        objective=objective,
    )


def _replace_ids(batch: PackedBatch, input_ids: torch.Tensor) -> PackedBatch:
    from dataclasses import replace

    return replace(batch, input_ids=input_ids)


def _packed_roles(model, batch: PackedBatch, response_mask) -> tuple[torch.Tensor, list[str]]:
    roles = batch.roles.long().clone()
    roles[roles == Role.FIRST] = -1  # the first token of a row is never a target
    mask = _check_response_mask(response_mask, batch.shape)
    if mask is not None:
        inside = (roles == Role.PROMPT) | (roles == Role.RESPONSE)
        roles[inside] = torch.where(mask[inside], int(Role.RESPONSE), int(Role.PROMPT))
        return roles, ["prompt/response from response_mask"]
    if batch.roles_from_labels:  # from_flattening: roles were inferred from the labels
        inside = (roles == Role.PROMPT) | (roles == Role.RESPONSE)
        roles[inside] = int(Role.UNKNOWN)
        roles = _mark_eos(model, batch.input_ids, _dense_ids(batch.seq_ids)[0], roles)
        return roles, ["prompt/response unknown (PackedBatch.from_flattening infers them from the "
                       "labels): pass response_mask to check them"]
    return roles, ["prompt/response/EOS from PackedBatch.roles"]


# ---------------------------------------------------------------------------- plain dicts


def dict_pipeline(model, batch: Mapping, response_mask, forward_kwargs, seq=None, source=None,
                  objective: str = "sft") -> Pipeline:
    """The pipeline ``model(**batch, **forward_kwargs)``; ``seq`` (B, T) overrides the batch's boundaries;
    ``objective`` as :data:`OBJECTIVES` ("lm": every real token is a target). A model running the
    chunked-CE forward some TRL versions leave on it gets the batch without labels / shift_labels, or
    it returns no logits (:func:`packsim.core.upstream.trl_trainers.logit_fields`; its module names them)."""
    fields = dict(batch)
    if seq is None:
        seq, ex_ids, found = _dict_boundaries(fields)  # checks input_ids is (B, T) first
        source = source or found
    else:
        ex_ids = list(range(int(seq.max()) + 1))
    ids = fields["input_ids"]
    _check_field_shapes(fields, ids.shape)
    mask = _objective_mask(objective, _check_response_mask(response_mask, ids.shape), ids.shape)
    roles, notes = dict_roles(model, fields, seq, mask)
    if objective == "lm":
        notes[0] = LM_NOTE
    fields_no_ids, dropped = logit_fields(model, {k: v for k, v in fields.items() if k != "input_ids"})

    def run(input_ids=None, inputs_embeds=None, output_attentions=False) -> ForwardOutput:
        extra = {"output_attentions": True} if output_attentions else {}
        if inputs_embeds is not None:
            return logits_of(model(inputs_embeds=inputs_embeds, **fields_no_ids, **forward_kwargs, **extra))
        x = ids if input_ids is None else input_ids
        return logits_of(model(input_ids=x, **fields_no_ids, **forward_kwargs, **extra))

    pos = fields.get("position_ids")
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    kw = _kwargs_text(forward_kwargs)
    return Pipeline(
        model=model, run=run, input_ids=ids, seq=seq, example_ids=ex_ids, boundaries=source,
        labels=fields.get("labels"), roles=roles, role_notes=notes,
        positions=None if pos is None else text_positions(pos, *ids.shape),
        expected_positions=example_positions(seq),
        forward=f"model(**batch{kw}), batch keys {sorted(fields)}{dropped}, attn_implementation={impl!r}",
        context={"kind": "dict", "fields": fields, "impl": impl, "forward_kwargs": forward_kwargs},
        run_alone=lambda x, pos, mask: logits_of(
            model(input_ids=x, position_ids=pos, attention_mask=mask, **forward_kwargs)).logits,
        objective=objective,
    )


def _check_field_shapes(fields: dict, shape) -> None:
    B, T = shape
    for key in ("labels", "position_ids", "seq_idx"):
        if fields.get(key) is not None and tuple(torch.as_tensor(fields[key]).shape[-1:]) != (T,):
            raise PacksimError(
                f"batch[{key!r}] has shape {tuple(torch.as_tensor(fields[key]).shape)} but input_ids has "
                f"{tuple(shape)}: every per-token field must have one entry per token; rebuild them "
                "from the same examples."
            )
    mask = fields.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() in (2, 4):
        ok = tuple(mask.shape) == (B, T) if mask.dim() == 2 else tuple(mask.shape[-2:]) == (T, T)
        if not ok:
            raise PacksimError(
                f"batch['attention_mask'] has shape {tuple(mask.shape)}, which does not fit input_ids "
                f"{tuple(shape)}: pass a (B, T) or (B, 1, T, T) mask of the same batch."
            )


def _dict_boundaries(fields: dict) -> tuple[torch.Tensor, list[int], str]:
    """Example index per token (B, T), 0..S-1 (-1 padding), by :func:`find_boundaries`'s precedence."""
    found = find_boundaries(fields)
    seq = found.seq_ids.to(fields["input_ids"].device)
    if found.num_examples < 2:
        raise _no_boundaries(f"{found.source} describes {found.num_examples} example(s)")
    return seq, list(range(found.num_examples)), found.source


def _no_boundaries(why: str) -> PacksimError:
    return PacksimError(
        f"the batch carries no example boundaries the audit can use ({why}): pass cu_seq_lens_q, "
        "seq_idx, or position_ids that restart at 0 for each example "
        "(DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True) gives all "
        "three), with at least two examples."
    )


def dict_roles(model, fields: dict, seq: torch.Tensor, mask) -> tuple[torch.Tensor, list[str]]:
    """Role per token (B, T) for a dict batch: padding, row start, boundary, then prompt/response."""
    roles = torch.full_like(seq, int(Role.UNKNOWN))
    notes = []
    if mask is not None:
        roles = torch.where(mask.to(seq.device), int(Role.RESPONSE), int(Role.PROMPT))
        notes.append("prompt/response from response_mask")
    else:
        notes.append("prompt/response unknown: pass response_mask (bool per token) to check them")
    roles = _mark_eos(model, fields["input_ids"], seq, roles)
    roles[run_starts(seq) & (seq >= 0)] = int(Role.BOUNDARY)
    roles[:, 0] = -1  # never a target (the shift drops it)
    roles[seq < 0] = int(Role.PAD)
    if not (isinstance(fields.get("attention_mask"), torch.Tensor) and fields["attention_mask"].dim() == 2):
        notes.append("padding unknown (no 2D attention_mask)")
    return roles, notes


def _mark_eos(model, input_ids: torch.Tensor, seq: torch.Tensor, roles: torch.Tensor) -> torch.Tensor:
    """Mark the last token of each example as EOS when it is the model's eos_token_id."""
    eos = token_ids("eos", getattr(model, "config", None))
    if not eos:
        return roles
    last = torch.ones_like(seq, dtype=torch.bool)  # (B, T): the last token of a run
    last[:, :-1] = run_starts(seq)[:, 1:]
    is_eos = is_token(input_ids, eos)
    roles = roles.clone()
    roles[last & (seq >= 0) & is_eos] = int(Role.EOS)
    return roles


