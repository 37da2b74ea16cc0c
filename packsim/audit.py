"""The contamination audit: does a packed pipeline keep its examples apart, and count the right labels?

``packsim.audit(model, batch)`` answers "how would you detect cross-example contamination after a
run has finished?" with evidence, on a CPU, in about a second for a tiny model. It runs the SAME
forward the pipeline runs, many times with small changes, and measures:

1. **perturbation**: change the tokens of example i, rerun, take the largest change of any other
   example j's logits. Isolated means unchanged up to float tolerance.
2. **gradient**: gradient of example j's loss with respect to example i's input embeddings,
   relative to the gradient with respect to j's own embeddings.
3. **attention_mass**: the share of each query's attention that lands outside its own example,
   per layer and head (where attention probabilities can be had: packsim models, eager).
4. **loss_coverage**: which labels are counted: prompt, padding, the boundary token (predicting
   the next example's first token from the previous example's last), response, EOS.
5. **positions**: whether position ids restart at each example, and whether that matters for
   this model (RoPE is shift-invariant; absolute position embeddings are not).

``batch`` is a :class:`~packsim.batch.PackedBatch` (run with :func:`packsim.model.forward` under
its setup; ``forward_kwargs`` go to that function, e.g. ``backend="blocked"``) or a plain dict of
collator fields (run as ``model(**batch, **forward_kwargs)``, e.g. ``use_cache=False``).
Example boundaries come from whatever the batch carries; the report says where it found them.

Used by notebook 06_detect_contamination and the ``packsim audit`` command.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .batch import PackedBatch
from .errors import PacksimError
from .loss import IGNORE_INDEX, Role
from .model import outside_share

__all__ = ["PROBES", "ProbeResult", "WorstPair", "AuditReport", "audit", "add_arguments", "run"]

PROBES = ("perturbation", "gradient", "attention_mass", "loss_coverage", "positions")

# Float tolerance for "unchanged", by logits dtype. Measured cross-example changes of a leaking
# tiny Llama are 1e-2..1; an isolating forward gives exactly 0 or float round-off (~1e-7).
_TOL = {torch.float64: 1e-9, torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 3e-2}
_UNKNOWN = 6  # role code for "inside an example, prompt or response not known" (dict batches)
_ROLE_NAMES = {
    int(Role.PROMPT): "prompt",
    int(Role.RESPONSE): "response",
    int(Role.EOS): "EOS",
    int(Role.BOUNDARY): "boundary",
    int(Role.PAD): "padding",
    _UNKNOWN: "unknown",
}
_FA_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
_POS_EMB_NAMES = ("wpe", "embed_positions", "position_embeddings", "pos_emb")
_MAX_DENSE = 2**24  # attention_maps builds (L, B, H, T, T) densely: cap B*T*T (16M floats per head)


# ============================================================================= report


@dataclass
class ProbeResult:
    """One probe: ``status`` is ``"pass"``, ``"fail"`` or ``"skipped"`` (never counted as a pass).

    ``value`` is the probe's number (compared with ``threshold``); ``summary`` says in words what
    it measured; ``details`` holds the raw evidence (counts, per-layer numbers).
    """

    name: str
    status: str
    value: float | None
    threshold: float | None
    summary: str
    details: dict = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status == "fail"


@dataclass(frozen=True)
class WorstPair:
    """The pair of examples with the largest cross-example effect (ids as the report shows them)."""

    perturbed: int
    affected: int
    logit_change: float
    gradient_ratio: float | None

    def __str__(self) -> str:
        grad = "" if self.gradient_ratio is None else f", gradient ratio {self.gradient_ratio:.2e}"
        return (f"changing example {self.perturbed} moves example {self.affected}'s logits by "
                f"{self.logit_change:.3g}{grad}")


@dataclass
class AuditReport:
    """What :func:`audit` found. ``ok`` / ``failed`` make it usable as a CI gate.

    Attributes:
        probes: name -> :class:`ProbeResult`, in :data:`PROBES` order;
        boundaries: where the example boundaries came from (e.g. ``"cu_seq_lens_q"``);
        example_ids: the examples' ids as shown in the report (S,);
        logit_change: (S, S) float, ``[i, j]`` = max |change| of example j's logits when example
            i is perturbed (NaN for rows not perturbed);
        gradient_ratio: (S, S) float, ``[i, j]`` = max |d loss_j / d emb_i| / max |d loss_j / d emb_j|
            (NaN where not computed), or None when the probe was skipped;
        attention_outside: (L, H) float, per layer and head the largest share of one query's
            attention outside its example, or None when skipped;
        worst_pair, causes (plain-language likely causes and fixes), forward (what was run),
        seconds (wall time of the audit).
    """

    probes: dict[str, ProbeResult]
    boundaries: str
    example_ids: list[int]
    forward: str
    logit_change: torch.Tensor
    gradient_ratio: torch.Tensor | None
    attention_outside: torch.Tensor | None
    worst_pair: WorstPair | None
    causes: list[str]
    seconds: float

    @property
    def failed(self) -> list[str]:
        """Names of the failed probes, in :data:`PROBES` order."""
        return [name for name, p in self.probes.items() if p.failed]

    @property
    def skipped(self) -> list[str]:
        return [name for name, p in self.probes.items() if p.status == "skipped"]

    @property
    def ok(self) -> bool:
        """True when no probe failed (skipped probes are listed in the verdict, not failures)."""
        return not self.failed

    @property
    def verdict(self) -> str:
        """One line: PASS/FAIL, the failed probes, and the first likely cause."""
        skipped = f"; skipped: {', '.join(self.skipped)}" if self.skipped else ""
        n = len(self.example_ids)
        if self.ok:
            return f"PASS: {n} examples isolated and the loss counts only responses{skipped}."
        leak = self.probes["perturbation"].failed and self.worst_pair is not None
        lead = f" {self.worst_pair}." if leak else ""
        lead += f" {self.causes[0]}" if self.causes else ""
        return f"FAIL ({', '.join(self.failed)}):{lead}{skipped}"

    def rows(self) -> list[tuple[str, str, str, str, str]]:
        """Table rows: (probe, result, value, threshold, evidence)."""
        out = []
        for p in self.probes.values():
            value = "-" if p.value is None else f"{p.value:.3g}"
            thr = "-" if p.threshold is None else f"{p.threshold:.0e}" if p.threshold else "0"
            out.append((p.name, p.status.upper(), value, thr, p.summary))
        return out

    def table(self) -> str:
        """The report as plain text: verdict, where boundaries came from, the probe table, causes."""
        head = ("probe", "result", "value", "threshold", "evidence")
        rows = [head, *self.rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = [self.verdict,
                 f"examples: {len(self.example_ids)}; boundaries from {self.boundaries}; "
                 f"forward: {self.forward}; audit took {self.seconds:.2f} s"]
        for r in rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4])
        if self.worst_pair is not None:
            lines.append(f"worst pair: {self.worst_pair}")
        lines += [f"likely cause: {c}" for c in self.causes]
        return "\n".join(lines)

    def to_html(self) -> str:
        """The same report as an HTML table (notebooks show it through ``_repr_html_``)."""
        color = {"PASS": "#1a7f37", "FAIL": "#cf222e", "SKIPPED": "#9a6700"}
        cells = "".join(
            f"<tr><td><code>{n}</code></td><td style='color:{color[s]};font-weight:bold'>{s}</td>"
            f"<td>{v}</td><td>{t}</td><td style='text-align:left'>{html.escape(e)}</td></tr>"
            for n, s, v, t, e in self.rows()
        )
        extra = [f"worst pair: {self.worst_pair}"] if self.worst_pair is not None else []
        extra += [f"likely cause: {c}" for c in self.causes]
        notes = "".join(f"<li>{html.escape(x)}</li>" for x in extra)
        return (
            f"<div class='packsim-audit'><p><b>{html.escape(self.verdict)}</b></p>"
            f"<p>{len(self.example_ids)} examples; boundaries from {html.escape(self.boundaries)}; "
            f"forward: <code>{html.escape(self.forward)}</code>; {self.seconds:.2f} s</p>"
            "<table><tr><th>probe</th><th>result</th><th>value</th><th>threshold</th>"
            f"<th>evidence</th></tr>{cells}</table><ul>{notes}</ul></div>"
        )

    def _repr_html_(self) -> str:
        return self.to_html()

    def __str__(self) -> str:
        return self.table()


# ============================================================================= the pipeline


@dataclass
class _Out:
    logits: torch.Tensor  # (B, T, V)
    cache: object = None
    attentions: tuple | None = None


@dataclass
class _Pipeline:
    """Everything the probes need, whatever the batch format.

    run(input_ids=None, inputs_embeds=None, output_attentions=False) -> _Out runs the pipeline's
    forward with the tokens (or embeddings) replaced. seq (B, T) long: dense example index
    0..S-1, -1 on padding. roles (B, T): packsim Role codes, or _UNKNOWN.
    """

    model: torch.nn.Module
    run: Callable[..., _Out]
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


def _model_device(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


@contextmanager
def _same_randomness(seed: int, device: torch.device):
    """Every forward sees the same RNG state, so dropout in train mode cancels out of differences."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield


def _logits_of(out) -> _Out:
    if isinstance(out, torch.Tensor):
        return _Out(out)
    logits = getattr(out, "logits", None)
    if logits is None:
        raise PacksimError(
            f"the model returned {type(out).__name__} without .logits: audit a causal LM whose "
            "forward returns logits (B, T, V), e.g. a transformers *ForCausalLM."
        )
    fields = out if isinstance(out, Mapping) else getattr(out, "__dict__", {})  # ModelOutput: a dict
    keys = list(fields.keys())  # not .get("past_key_values"): transformers 5 warns on the old name
    cache = next((fields[k] for k in ("cache", "past_key_values") if k in keys), None)
    return _Out(logits, cache, fields.get("attentions"))


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


def _dense_ids(ids: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """Relabel example ids (B, T) (-1 = padding) to 0..S-1 in order of value; return the labels."""
    real = ids >= 0
    values, inverse = torch.unique(ids[real], return_inverse=True)
    dense = torch.full_like(ids, -1)
    dense[real] = inverse
    return dense, values.tolist()


def _expected_positions(seq: torch.Tensor) -> torch.Tensor:
    """(B, T): 0, 1, ... inside each run of one example id (padding runs count too)."""
    B, T = seq.shape
    starts = torch.ones_like(seq, dtype=torch.bool)
    starts[:, 1:] = seq[:, 1:] != seq[:, :-1]
    idx = torch.arange(T, device=seq.device).expand(B, T)
    run_start = torch.where(starts, idx, torch.zeros_like(idx)).cummax(dim=1).values
    return idx - run_start


# ---------------------------------------------------------------------------- PackedBatch


def _packed_pipeline(model, batch: PackedBatch, response_mask, forward_kwargs) -> _Pipeline:
    from .model import forward

    def run(input_ids=None, inputs_embeds=None, output_attentions=False) -> _Out:
        b = batch if input_ids is None else _replace_ids(batch, input_ids)
        return _Out(forward(model, b, inputs_embeds=inputs_embeds, **forward_kwargs))

    seq, ids = _dense_ids(batch.seq_ids)
    roles, notes = _packed_roles(model, batch, response_mask)
    kw = "".join(f", {k}={v!r}" for k, v in forward_kwargs.items())
    return _Pipeline(
        model=model, run=run, input_ids=batch.input_ids, seq=seq, example_ids=ids,
        boundaries="PackedBatch.seq_ids (how the examples were packed)",
        labels=batch.labels, roles=roles, role_notes=notes, positions=batch.position_ids,
        expected_positions=batch.example_positions,
        forward=f"packsim.model.forward(model, batch{kw}) under setup {batch.setup.name!r}",
        context={"kind": "packed", "setup": batch.setup, "batch": batch},
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
    if batch.strategy == "given":  # from_flattening: roles were inferred from the labels
        inside = (roles == Role.PROMPT) | (roles == Role.RESPONSE)
        roles[inside] = _UNKNOWN
        roles = _mark_eos(model, batch.input_ids, _dense_ids(batch.seq_ids)[0], roles)
        return roles, ["prompt/response unknown (PackedBatch.from_flattening infers them from the "
                       "labels): pass response_mask to check them"]
    return roles, ["prompt/response/EOS from PackedBatch.roles"]


# ---------------------------------------------------------------------------- plain dicts


def _dict_pipeline(model, batch: Mapping, response_mask, forward_kwargs) -> _Pipeline:
    fields = dict(batch)
    ids = fields.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        got = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise PacksimError(
            f"batch['input_ids'] must be a (B, T) tensor, got {got}: pass the collator's output "
            "(e.g. DataCollatorWithFlattening returns input_ids of shape (1, total_tokens))."
        )
    _check_field_shapes(fields, ids.shape)
    seq, ex_ids, source = _dict_boundaries(fields, ids.shape)
    roles, notes = _dict_roles(model, fields, seq, _check_response_mask(response_mask, ids.shape))
    fields_no_ids = {k: v for k, v in fields.items() if k != "input_ids"}

    def run(input_ids=None, inputs_embeds=None, output_attentions=False) -> _Out:
        extra = {"output_attentions": True} if output_attentions else {}
        if inputs_embeds is not None:
            return _logits_of(model(inputs_embeds=inputs_embeds, **fields_no_ids, **forward_kwargs, **extra))
        x = ids if input_ids is None else input_ids
        return _logits_of(model(input_ids=x, **fields_no_ids, **forward_kwargs, **extra))

    pos = fields.get("position_ids")
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    kw = "".join(f", {k}={v!r}" for k, v in forward_kwargs.items())
    return _Pipeline(
        model=model, run=run, input_ids=ids, seq=seq, example_ids=ex_ids, boundaries=source,
        labels=fields.get("labels"), roles=roles, role_notes=notes,
        positions=None if pos is None else torch.as_tensor(pos).expand(ids.shape),
        expected_positions=_expected_positions(seq),
        forward=f"model(**batch{kw}), batch keys {sorted(fields)}, attn_implementation={impl!r}",
        context={"kind": "dict", "fields": fields, "impl": impl, "forward_kwargs": forward_kwargs},
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


def _dict_boundaries(fields: dict, shape) -> tuple[torch.Tensor, list[int], str]:
    """Example index per token (B, T) from cu_seq_lens_q, else seq_idx, else position_ids resets.

    Padding (-1): tokens past cu_seq_lens_q[-1], negative seq_idx, attention_mask == 0.
    """
    B, T = shape
    device = fields["input_ids"].device
    starts, pad, source = _starts(fields, B, T)
    starts, pad = starts.to(device), pad.to(device)
    starts[:, 0] = True  # rows never share an example
    seq = starts.reshape(-1).cumsum(0).reshape(B, T) - 1
    seq[pad] = -1
    mask = fields.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:
        seq[mask == 0] = -1
        source += "; padding from attention_mask == 0"
    seq, ids = _dense_ids(seq)
    if len(ids) < 2:
        raise _no_boundaries(f"{source} describes {len(ids)} example(s)")
    return seq, list(range(len(ids))), source


def _starts(fields: dict, B: int, T: int) -> tuple[torch.Tensor, torch.Tensor, str]:
    """(starts (B, T) bool: a new example begins here, padding (B, T) bool, source name)."""
    no_pad = torch.zeros(B, T, dtype=torch.bool)
    if fields.get("cu_seq_lens_q") is not None:
        cu = fields["cu_seq_lens_q"]
        return _starts_from_cu(cu, B, T), _beyond_cu(cu, B, T), "cu_seq_lens_q"
    for key, source in (("seq_idx", "seq_idx"), ("position_ids", "position_ids (where they restart)")):
        if fields.get(key) is not None:
            ids = torch.as_tensor(fields[key]).expand(B, T).cpu()
            starts = torch.ones(B, T, dtype=torch.bool)
            step = 0 if key == "seq_idx" else 1  # same id continues / position continues by +1
            starts[:, 1:] = ids[:, 1:] - ids[:, :-1] != step
            return starts, (ids < 0) if key == "seq_idx" else no_pad, source
    raise _no_boundaries("it has none of cu_seq_lens_q, seq_idx, position_ids")


def _no_boundaries(why: str) -> PacksimError:
    return PacksimError(
        f"the batch carries no example boundaries the audit can use ({why}): pass cu_seq_lens_q, "
        "seq_idx, or position_ids that restart at 0 for each example "
        "(DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True) gives all "
        "three), with at least two examples."
    )


def _starts_from_cu(cu, B: int, T: int) -> torch.Tensor:
    from .masks import check_cu_seqlens

    cu = torch.as_tensor(cu).reshape(-1).to(torch.int32).cpu()
    end = int(cu[-1]) if cu.numel() else 0
    if end > B * T:
        raise PacksimError(
            f"cu_seq_lens_q ends at {end} but input_ids holds {B}x{T}={B * T} tokens: the offsets "
            "belong to a different (longer) batch; rebuild them from the same examples."
        )
    offsets = check_cu_seqlens(cu, end, name="cu_seq_lens_q")
    starts = torch.zeros(B * T, dtype=torch.bool)
    starts[torch.tensor(offsets[:-1], dtype=torch.long)] = True
    return starts.view(B, T)


def _beyond_cu(cu, B: int, T: int) -> torch.Tensor:
    end = int(torch.as_tensor(cu).reshape(-1)[-1])
    beyond = torch.zeros(B * T, dtype=torch.bool)
    beyond[end:] = True  # tokens after the last offset: padding (flash-attn ignores them)
    return beyond.view(B, T)


def _dict_roles(model, fields: dict, seq: torch.Tensor, mask) -> tuple[torch.Tensor, list[str]]:
    """Role per token (B, T) for a dict batch: padding, row start, boundary, then prompt/response."""
    roles = torch.full_like(seq, _UNKNOWN)
    notes = []
    if mask is not None:
        roles = torch.where(mask.to(seq.device), int(Role.RESPONSE), int(Role.PROMPT))
        notes.append("prompt/response from response_mask")
    else:
        notes.append("prompt/response unknown: pass response_mask (bool per token) to check them")
    roles = _mark_eos(model, fields["input_ids"], seq, roles)
    starts = torch.zeros_like(seq, dtype=torch.bool)
    starts[:, 1:] = seq[:, 1:] != seq[:, :-1]
    roles[starts & (seq >= 0)] = int(Role.BOUNDARY)
    roles[:, 0] = -1  # never a target (the shift drops it)
    roles[seq < 0] = int(Role.PAD)
    if not (isinstance(fields.get("attention_mask"), torch.Tensor) and fields["attention_mask"].dim() == 2):
        notes.append("padding unknown (no 2D attention_mask)")
    return roles, notes


def _mark_eos(model, input_ids: torch.Tensor, seq: torch.Tensor, roles: torch.Tensor) -> torch.Tensor:
    """Mark the last token of each example as EOS when it is the model's eos_token_id."""
    eos = getattr(getattr(model, "config", None), "eos_token_id", None)
    eos = {eos} if isinstance(eos, int) else set(eos or [])
    if not eos:
        return roles
    last = torch.zeros_like(seq, dtype=torch.bool)
    last[:, :-1] = seq[:, :-1] != seq[:, 1:]
    last[:, -1] = True
    is_eos = torch.isin(input_ids, torch.tensor(sorted(eos), device=input_ids.device))
    roles = roles.clone()
    roles[last & (seq >= 0) & is_eos] = int(Role.EOS)
    return roles


# ============================================================================= probes


def _probe_examples(S: int, max_examples: int) -> list[int]:
    """Which examples to perturb: all, or ``max_examples`` spread evenly."""
    if S <= max_examples:
        return list(range(S))
    return sorted({int(round(x)) for x in torch.linspace(0, S - 1, max_examples).tolist()})


def _vocab_size(model) -> int:
    try:
        return int(model.get_input_embeddings().num_embeddings)
    except AttributeError:
        size = getattr(getattr(model, "config", None), "vocab_size", None)
        if size is None:
            raise PacksimError(
                "cannot tell the model's vocabulary size (no get_input_embeddings() and no "
                "config.vocab_size): the perturbation probe needs it to draw replacement tokens."
            ) from None
        return int(size)


def _per_example_max(values: torch.Tensor, seq: torch.Tensor, S: int) -> torch.Tensor:
    """values (B, T) -> (S,) max over each example's tokens (padding ignored)."""
    real = seq >= 0
    out = torch.zeros(S, dtype=values.dtype, device=values.device)
    return out.scatter_reduce(0, seq[real], values[real], reduce="amax", include_self=True)


def _perturbation(p: _Pipeline, base: torch.Tensor, chosen, tol, seed) -> tuple[ProbeResult, torch.Tensor]:
    """Logit change matrix (S, S): perturb each chosen example i, max |change| of each example j."""
    S = len(p.example_ids)
    V = _vocab_size(p.model)
    gen = torch.Generator().manual_seed(seed)
    change = torch.full((S, S), float("nan"))
    for i in chosen:
        ids = p.input_ids.clone()
        where = p.seq == i
        offset = int(torch.randint(1, V, (1,), generator=gen))
        ids[where] = (ids[where] + offset) % V
        with torch.no_grad(), _same_randomness(seed, base.device):
            logits = p.run(input_ids=ids).logits.float()
        diff = (logits - base).abs().amax(-1)  # (B, T)
        change[i] = _per_example_max(diff, p.seq, S).cpu()
    cross = change.clone()
    cross.fill_diagonal_(float("nan"))
    worst = float(torch.nan_to_num(cross, nan=0.0).max()) if S > 1 else 0.0
    own = torch.diagonal(change)[chosen]
    if bool((own <= tol).all()):
        return ProbeResult("perturbation", "skipped", worst, tol,
                           "changing an example's tokens does not change even its own logits: the "
                           "model output does not depend on input_ids as passed"), change
    n_leaky = int((torch.nan_to_num(cross, nan=0.0) > tol).sum())
    summary = (f"max |change| of another example's logits when one example's tokens change "
               f"({len(chosen)} perturbed; {n_leaky} leaking pairs)")
    status = "fail" if worst > tol else "pass"
    return ProbeResult("perturbation", status, worst, tol, summary, {"leaking_pairs": n_leaky}), change


def _example_loss(logits: torch.Tensor, ids: torch.Tensor, seq: torch.Tensor, j: int) -> torch.Tensor:
    """Example j's next-token loss inside itself: logits (B, T, V) of j's tokens, targets = its next tokens.

    A function of j's logits only (labels are not used: they may be the bug under audit).
    """
    inside = (seq[:, :-1] == j) & (seq[:, 1:] == j)  # (B, T-1): a next token of the same example
    if bool(inside.any()):
        return F.cross_entropy(logits[:, :-1][inside].float(), ids[:, 1:][inside], reduction="sum")
    return logits[seq == j].float().logsumexp(-1).sum()  # one-token example


def _gradient(p: _Pipeline, chosen, tol, seed) -> tuple[ProbeResult, torch.Tensor | None]:
    """Gradient ratio matrix (S, S): [i, j] = max |d loss_j/d emb_i| / max |d loss_j/d emb_j|."""
    S = len(p.example_ids)
    try:
        emb = p.model.get_input_embeddings()(p.input_ids).detach().requires_grad_(True)  # (B, T, d)
        with torch.enable_grad(), _same_randomness(seed, emb.device):
            logits = p.run(inputs_embeds=emb).logits
            ratio = torch.full((S, S), float("nan"))
            for j in chosen:
                (g,) = torch.autograd.grad(_example_loss(logits, p.input_ids, p.seq, j), emb,
                                           retain_graph=True)
                per = _per_example_max(g.detach().abs().amax(-1).float(), p.seq, S).cpu()  # (S,)
                ratio[:, j] = per / per[j] if per[j] > 0 else float("nan")
    except (NotImplementedError, RuntimeError, TypeError, AttributeError) as err:
        msg = str(err).splitlines()[0][:160]
        return ProbeResult("gradient", "skipped", None, tol,
                           f"no gradient through this forward here: {type(err).__name__}: {msg}"), None
    cross = ratio.clone()
    cross.fill_diagonal_(float("nan"))
    worst = float(torch.nan_to_num(cross, nan=0.0).max())
    status = "fail" if worst > tol else "pass"
    return ProbeResult("gradient", status, worst, tol,
                       "max |d loss_j / d emb_i| over i != j, relative to j's own embeddings "
                       f"({len(chosen)} examples' losses)"), ratio


def _attention_probs(p: _Pipeline, base: torch.Tensor, tol) -> tuple[torch.Tensor | None, str, str]:
    """Attention probabilities (L, B, H, T, T) of the pipeline's forward, or (None, why, source)."""
    if p.context["kind"] == "packed":
        from .model import attention_maps

        B, T = p.input_ids.shape
        if B * T * T > _MAX_DENSE:
            return None, (f"rows of {T} tokens are too long for dense attention maps (B*T*T = "
                          f"{B * T * T:.1e} per head); audit a shorter batch for this probe"), ""
        try:
            return attention_maps(p.model, p.context["batch"]), "", "packsim.model.attention_maps"
        except Exception as err:  # noqa: BLE001 - any model that cannot run packsim's attention
            return None, f"packsim.model.attention_maps failed: {type(err).__name__}: {err}", ""
    impl = p.context["impl"]
    try:
        with torch.no_grad():
            out = p.run(output_attentions=True)
    except Exception as err:  # noqa: BLE001 - report, don't crash: this probe is optional
        return None, f"output_attentions=True failed: {type(err).__name__}: {err}", ""
    att = out.attentions
    if not att or any(a is None for a in att):
        return None, (f"attn_implementation={impl!r} returns no attention probabilities "
                      "(run the model with attn_implementation='eager' to get this probe)"), ""
    if (out.logits.float() - base).abs().max() > tol:
        return None, "output_attentions=True changed the logits, so it is not the same forward", ""
    return torch.stack([a.detach().float() for a in att]), "", "output_attentions=True"


def _attention_mass(p: _Pipeline, base, tol) -> tuple[ProbeResult, torch.Tensor | None]:
    """Per (layer, head): the largest share of one query's attention on keys outside its example."""
    probs, why, source = _attention_probs(p, base, tol)
    if probs is None:
        return ProbeResult("attention_mass", "skipped", None, tol, why), None
    seq = p.seq.to(probs.device)  # (B, T)
    outside = outside_share(probs, seq)  # (L, B, H, T)
    real_q = (seq >= 0)[None, :, None, :]  # (1, B, 1, T)
    outside = torch.where(real_q, outside, torch.zeros_like(outside))
    per_lh = outside.amax(dim=(1, 3)).cpu()  # (L, H)
    worst = float(per_lh.max())
    L, H = per_lh.shape
    leaky = [int(layer) for layer in range(L) if per_lh[layer].max() > tol]
    flat = int(per_lh.argmax())
    where = f"worst: layer {flat // H} head {flat % H}" if worst > tol else "no layer leaks"
    summary = (f"largest share of a query's attention outside its example ({source}, {L} layers x "
               f"{H} heads; {where})")
    return ProbeResult("attention_mass", "fail" if worst > tol else "pass", worst, tol, summary,
                       {"leaking_layers": leaky, "n_layers": L}), per_lh


def _loss_coverage(p: _Pipeline) -> ProbeResult:
    """Which labels are counted, by role; flags wrong ones (counted non-response, uncounted response).

    A label at token t is counted when it is not -100 (t > 0 in its row: the shift drops t = 0).
    """
    if p.labels is None:
        return ProbeResult("loss_coverage", "skipped", None, 0, "the batch carries no labels")
    labels = torch.as_tensor(p.labels).reshape(p.input_ids.shape).to(p.roles.device)
    counted = labels != IGNORE_INDEX  # (B, T)
    counts = {name: (int((counted & (p.roles == code)).sum()), int((p.roles == code).sum()))
              for code, name in _ROLE_NAMES.items()}
    problems = _coverage_problems(counts)
    summary = "counted/total: " + ", ".join(f"{name} {c}/{n}" for name, (c, n) in counts.items() if n)
    if problems:
        summary += "; WRONG: " + "; ".join(text for _, _, text in problems)
    summary += " (" + "; ".join(p.role_notes) + ")"
    return ProbeResult("loss_coverage", "fail" if problems else "pass",
                       float(sum(n for _, n, _ in problems)), 0, summary,
                       {"counts": counts, "problems": [key for key, _, _ in problems]})


def _coverage_problems(counts: dict) -> list[tuple[str, int, str]]:
    """(role, number of wrong tokens, text) for each kind of wrong label."""
    problems = []
    for name in ("prompt", "padding", "boundary"):
        c, _ = counts[name]
        if c:
            problems.append((name, c, f"{c} {name} token(s) counted"))
    for name in ("response", "EOS"):
        c, n = counts[name]
        if n - c:
            problems.append((name, n - c, f"{n - c} {name} token(s) not counted"))
    c, n = counts["unknown"]
    if n and c == n:
        problems.append(("every", n, f"all {n} tokens inside the examples are counted (only "
                                     "boundaries are ignored), so any prompt is in the loss"))
    return problems


def _position_kind(model) -> str:
    names = [n for n, _ in model.named_modules()]
    if any(n.endswith("rotary_emb") for n in names):
        return "RoPE"
    for n, m in model.named_modules():
        if isinstance(m, torch.nn.Embedding) and n.split(".")[-1] in _POS_EMB_NAMES:
            return "absolute"
    return "unknown"


def _shift_effect(p: _Pipeline) -> tuple[float | None, str]:
    """Max logit change of one example alone when its positions are shifted (a model property)."""
    model = p.model
    lengths = torch.bincount(p.seq[p.seq >= 0], minlength=len(p.example_ids))
    j = int(lengths.argmax())
    x = p.input_ids[p.seq == j][None]  # (1, L)
    L = x.shape[1]
    config = getattr(model, "config", None)
    max_pos = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    shift = p.input_ids.shape[1] if max_pos is None else min(p.input_ids.shape[1], int(max_pos) - L)
    if shift <= 0:
        return None, "no room to shift positions"
    pos = torch.arange(L, device=x.device)[None]
    try:
        with torch.no_grad():
            a = _logits_of(model(input_ids=x, position_ids=pos, use_cache=False)).logits.float()
            b = _logits_of(model(input_ids=x, position_ids=pos + shift, use_cache=False)).logits.float()
    except Exception as err:  # noqa: BLE001 - a model without position_ids: report why
        return None, f"{type(err).__name__}: {str(err)[:120]}"
    return float((a - b).abs().max()), f"example {p.example_ids[j]} alone, positions +{shift}"


def _positions(p: _Pipeline, tol) -> ProbeResult:
    """Do positions restart per example, and does it matter for this model?"""
    real = p.seq >= 0
    if p.positions is None:
        reset, how = False, "absent: the model counts 0..T-1 across each row"
    else:
        pos = p.positions.to(p.expected_positions.device)
        reset = bool((pos[real] == p.expected_positions[real]).all())
        how = "restart at each example" if reset else "do not restart at each example"
    kind = _position_kind(p.model)
    effect, where = _shift_effect(p)
    shift_tol = max(1e-4, 10 * tol)  # RoPE is shift-invariant only up to round-off of the angles
    matters = None if effect is None else effect > shift_tol
    detail = {"reset": reset, "kind": kind, "shift_effect": effect}
    if effect is None:
        effect_txt = f"shift test not run ({where})"
    else:
        effect_txt = (f"shifting positions changes logits by {effect:.2g} ({where}): position "
                      f"{'matters' if matters else 'does not matter'} for this {kind} model")
    summary = f"position_ids {how}; {effect_txt}"
    if reset:
        return ProbeResult("positions", "pass", effect, shift_tol, summary, detail)
    if matters is None:
        status = "fail" if kind == "absolute" else "pass" if kind == "RoPE" else "skipped"
    else:
        status = "fail" if matters else "pass"
    return ProbeResult("positions", status, effect, shift_tol, summary, detail)


# ============================================================================= causes


def _causes(p: _Pipeline, probes: dict[str, ProbeResult], base_out: _Out) -> list[str]:
    causes = []
    leak = any(probes[n].failed for n in ("perturbation", "gradient", "attention_mass"))
    if leak:
        causes += _packed_leak_causes(p) if p.context["kind"] == "packed" else _dict_leak_causes(p, probes, base_out)
        causes += _layer_cause(probes["attention_mass"])
    causes += _loss_causes(probes["loss_coverage"])
    pos = probes["positions"]
    if pos.failed:
        causes.append("position_ids continue across examples and this model uses absolute positions, "
                      "so every later example is computed at positions it never has alone: reset "
                      "position_ids to 0 at each example.")
    return causes


def _packed_leak_causes(p: _Pipeline) -> list[str]:
    setup = p.context["setup"]
    if setup.mask == "causal" and setup.packed:
        return [f"setup {setup.name!r} uses mask='causal': one causal mask over the whole pack lets "
                "each example read the ones packed before it. Use a block-diagonal setup (e.g. "
                "'correct')."]
    return ["the setup is block-diagonal, yet attention still crosses examples: some attention "
            "call ignores the segments it is given (custom attention code, a patched layer)."]


def _dict_leak_causes(p: _Pipeline, probes, base_out: _Out) -> list[str]:
    fields, impl = p.context["fields"], p.context["impl"] or "unknown"
    mask = fields.get("attention_mask")
    mask = mask if isinstance(mask, torch.Tensor) else None
    causes = []
    if mask is not None and mask.dim() == 4:
        if mask.dtype == torch.bool and impl == "eager":
            causes.append("a boolean 4D attention_mask reached eager attention, which ADDS the mask to "
                          "the scores (True/False become +1/+0), so it masks nothing: pass a float "
                          "mask with 0 where allowed and -inf (or finfo.min) elsewhere.")
        else:
            causes.append("the 4D attention_mask passed with the batch lets examples see each other: "
                          "check the boundaries it was built from (an off-by-one puts an example's "
                          "first token in the previous block).")
    elif impl.startswith("flash"):
        if mask is not None and bool((mask == 0).any()):
            causes.append("an attention_mask with zeros was passed, so flash attention unpadded from "
                          "it and ignored position_ids: drop it for a padding-free batch.")
    elif mask is not None:
        causes.append("an attention_mask was passed, so position_ids were ignored: transformers "
                      "finds packed examples from position_ids only when attention_mask is None "
                      "(even an all-ones mask turns that off). Drop attention_mask from the batch.")
    elif base_out.cache is not None:
        causes.append("transformers skipped packed-sequence detection because a cache was created "
                      "(use_cache is true in the call or in model.config, the default for a "
                      "hand-built config): pass use_cache=False.")
    elif not probes["positions"].details.get("reset"):
        causes.append("position_ids do not restart at each example, so transformers sees one long "
                      "sequence per row and applies a plain causal mask: pass per-example "
                      "position_ids (DataCollatorWithFlattening does).")
    if any(k in fields for k in _FA_KWARGS) and not impl.startswith("flash"):
        causes.append(f"note: cu_seq_lens_*/max_length_* are read only by flash attention; "
                      f"{impl!r} ignores them and isolates only through position_ids or a mask.")
    if not causes:
        causes.append("the batch looks right, yet attention crosses examples: check custom "
                      "attention code or patched layers.")
    return causes


def _layer_cause(attn: ProbeResult) -> list[str]:
    leaky, n = attn.details.get("leaking_layers"), attn.details.get("n_layers")
    if attn.failed and leaky and len(leaky) < n:
        return [f"only layer(s) {leaky} of {n} leak: look at what attention those layers receive "
                "(a patched or differently configured layer)."]
    return []


def _loss_causes(loss: ProbeResult) -> list[str]:
    fixes = {
        "prompt": "labels count prompt tokens: set them to -100 (completion-only loss).",
        "padding": "labels count padding: set the labels of padding tokens to -100.",
        "boundary": "labels count the first token of each later example, predicted from the previous "
                    "example's last token: set it to -100 (DataCollatorWithFlattening does).",
        "response": "some response tokens are not counted: only prompt, padding and boundary "
                    "tokens should be -100.",
        "EOS": "the EOS label is -100, so the model never learns to stop: keep EOS counted.",
        "every": "every token inside the examples is counted, so prompts are in the loss: mask them "
                 "with -100 (for plain language modelling without prompts, pass "
                 "response_mask=all True).",
    }
    return [fixes[key] for key in loss.details.get("problems", [])]


# ============================================================================= entry point


def _pipeline(model, batch, response_mask, forward_kwargs) -> _Pipeline:
    if isinstance(batch, PackedBatch):
        return _packed_pipeline(model, batch, response_mask, forward_kwargs)
    if isinstance(batch, Mapping):
        return _dict_pipeline(model, batch, response_mask, forward_kwargs)
    raise PacksimError(
        f"cannot audit a batch of type {type(batch).__name__}: pass a packsim.PackedBatch or the "
        "collator's dict (input_ids, labels, position_ids, ...)."
    )


def _baseline(p: _Pipeline, seed: int) -> _Out:
    device = _model_device(p.model)
    try:
        with torch.no_grad(), _same_randomness(seed, device):
            out = p.run()
    except TypeError as err:
        raise PacksimError(
            f"the model's forward does not accept this batch ({err}). The audit runs the "
            f"pipeline's forward exactly as given, {p.forward}: pass only the fields and kwargs "
            "that forward takes (e.g. drop seq_idx / cu_seq_lens_* for a model without **kwargs)."
        ) from err
    if tuple(out.logits.shape[:2]) != tuple(p.input_ids.shape):
        raise PacksimError(
            f"the model returned logits {tuple(out.logits.shape)} for input_ids "
            f"{tuple(p.input_ids.shape)}: audit a causal LM that returns one logit row per token."
        )
    return out


def audit(model, batch, response_mask=None, *, max_examples: int = 16, tol: float | None = None,
          seed: int = 0, **forward_kwargs) -> AuditReport:
    """Audit a packed pipeline for cross-example contamination and loss-coverage bugs.

    Args:
        model: a causal LM (transformers ``*ForCausalLM`` or anything returning ``.logits``).
        batch: a :class:`~packsim.batch.PackedBatch` (run with ``packsim.model.forward`` under its
            setup) or a dict of collator fields (run as ``model(**batch, **forward_kwargs)``):
            ``input_ids`` (B, T), ``labels``, ``position_ids``, optional ``attention_mask``,
            ``cu_seq_lens_q/k``, ``max_length_q/k``, ``seq_idx``.
        response_mask: optional bool (B, T), True on response tokens and EOS; lets the loss
            probe check prompt vs response for a dict batch.
        max_examples: perturb (and differentiate) at most this many examples, spread evenly.
        tol: float tolerance for "unchanged" (default by logits dtype: 1e-5 for fp32).
        seed: seeds the token perturbations and the RNG of every forward (dropout cancels out).
        **forward_kwargs: passed to every forward exactly as the pipeline passes them.

    Returns an :class:`AuditReport`; ``report.ok`` is False when a probe fails and
    ``report.failed`` names them. Used by notebook 06 and ``packsim audit``.
    """
    start = time.perf_counter()
    p = _pipeline(model, batch, response_mask, forward_kwargs)
    base_out = _baseline(p, seed)
    base = base_out.logits.float()
    tol = _TOL.get(base_out.logits.dtype, 1e-5) if tol is None else float(tol)
    chosen = _probe_examples(len(p.example_ids), max_examples)
    probes: dict[str, ProbeResult] = {}
    probes["perturbation"], change = _perturbation(p, base, chosen, tol, seed)
    probes["gradient"], ratio = _gradient(p, chosen, tol, seed)
    probes["attention_mass"], outside = _attention_mass(p, base, tol)
    probes["loss_coverage"] = _loss_coverage(p)
    probes["positions"] = _positions(p, tol)
    return AuditReport(
        probes=probes, boundaries=p.boundaries, example_ids=p.example_ids, forward=p.forward,
        logit_change=change, gradient_ratio=ratio, attention_outside=outside,
        worst_pair=_worst_pair(p.example_ids, change, ratio),
        causes=_causes(p, probes, base_out), seconds=time.perf_counter() - start,
    )


def _worst_pair(ids: list[int], change: torch.Tensor, ratio) -> WorstPair | None:
    cross = torch.nan_to_num(change.clone().fill_diagonal_(float("nan")), nan=-1.0)
    if len(ids) < 2 or float(cross.max()) <= 0:  # nothing moved: no offending pair
        return None
    flat = int(cross.argmax())
    i, j = divmod(flat, len(ids))
    g = None if ratio is None or torch.isnan(ratio[i, j]) else float(ratio[i, j])
    return WorstPair(ids[i], ids[j], float(cross[i, j]), g)


# ============================================================================= CLI


def add_arguments(parser) -> None:
    """``packsim audit`` options: which setups, the seed, and the size of the demo batch."""
    from .setups import SETUPS

    parser.add_argument("--setups", default=",".join(SETUPS),
                        help=f"comma-separated presets to audit (default: {','.join(SETUPS)})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the examples and the model")
    parser.add_argument("--examples", type=int, default=6, help="number of examples in the batch")
    parser.add_argument("--capacity", type=int, default=64, help="tokens per packed row")


def run(args) -> int:
    """Audit the built-in tiny pipeline (make_examples + build_model) under each setup; print tables."""
    from .data import make_examples
    from .model import build_model
    from .setups import get_setup

    names = [s.strip() for s in args.setups.split(",") if s.strip()]
    setups = [get_setup(name) for name in names]  # unknown names raise before any work
    examples = make_examples(args.examples, seed=args.seed)
    model = build_model("tiny", seed=args.seed)
    summary = []
    for setup in setups:
        batch = PackedBatch.from_examples(examples, capacity=args.capacity, setup=setup)
        report = audit(model, batch, seed=args.seed)
        print(f"=== setup {setup.name!r}: {batch!r}")
        print(report.table())
        print()
        summary.append((setup.name, "PASS" if report.ok else "FAIL", ", ".join(report.failed) or "-",
                        f"{report.seconds:.2f}s"))
    width = max(len(s[0]) for s in summary)
    print("summary")
    for name, result, failed, secs in summary:
        print(f"  {name.ljust(width)}  {result}  {secs}  failed: {failed}")
    return 0
