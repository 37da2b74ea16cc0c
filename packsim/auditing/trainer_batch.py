"""A Trainer's batches as the audit reads them: drawn with their features, their examples located.

:func:`draw_batches` draws the first batches of ``trainer.get_train_dataloader()`` (input_ids (B, T)
plus whatever the collator adds) with the features the collator was given for each. Where the
examples are: from evidence the collator did not write (:mod:`packsim.auditing.evidence`): the
features (the trainer's dataset items, TRL's packed rows split by ``seq_lengths``), each located as
a contiguous run of the batch's input_ids, else the special tokens; every boundary field
(position_ids, cu_seq_lens_q/k, seq_idx, a 4D mask) is checked against them (``boundary_fields``).
Without such evidence, the batch's own fields (cu_seq_lens_q > seq_idx > position_ids restarts; one
example per row without them), and the report says the verdict rests on them. Where the fields mark
at most one example per row, the tokens decide (:func:`batch_view`): a BOS after a row's first
token starts an example, and for TRL's wrapped packing the token after a run of EOS does too.
Prompt/response (:func:`response_mask`): from the collated features' split
(:func:`~packsim.auditing.features.response_mask_from_features`), all response for TRL's
language-modelling data, else unknown.

Outputs: a :class:`~packsim.auditing.findings.BatchView` whose ``seq`` (B, T) is the example of
every token (-1 padding), and a (B, T) bool response mask. Used by :mod:`packsim.auditing.trainer`.

Lessons: none directly.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from packsim.auditing.evidence import BoundaryEvidence, boundary_fields, collect, special_tokens
from packsim.auditing.features import feature_response_masks
from packsim.auditing.findings import BatchView, is_sft
from packsim.auditing.loss_findings import sft_language_modelling
from packsim.core.boundaries import ROWS_SOURCE, find_boundaries
from packsim.core.errors import PacksimError, raised_outside_packsim
from packsim.core.segments import seq_ids_from_starts
from packsim.core.special_tokens import example_starts, is_token, start_ids, token_ids

__all__ = ["batch_evidence", "batch_fields", "batch_view", "draw_batches", "is_wrapped", "response_mask", "same_fields"]


class _Recorder:
    """Wraps the trainer's collator to keep the features of each batch it collates."""

    def __init__(self, collate):
        self.collate, self.calls = collate, []

    def __call__(self, features):
        self.calls.append(list(features))
        return self.collate(features)


def draw_batches(trainer, n: int) -> list[tuple[dict, list | None]]:
    """The first ``n`` batches of the training dataloader, each with its features (None if unseen)."""
    original = trainer.data_collator
    recorder = _Recorder(original)
    trainer.data_collator = recorder
    try:
        drawn = []
        for batch in trainer.get_train_dataloader():
            drawn.append(batch_fields(batch, f"the trainer's batch {len(drawn)}"))
            if len(drawn) == n:
                break
    except Exception as err:  # the trainer's dataset or collator (its own training step would raise the same)
        if isinstance(err, PacksimError) or not raised_outside_packsim(err):
            raise
        raise PacksimError(f"drawing the trainer's training batches raised {type(err).__name__}: "
                           f"{(str(err).splitlines() or [''])[0][:200]} (its train_dataset, sampler or data collator): "
                           "fix the trainer so one training step runs, then audit it.") from err
    finally:
        trainer.data_collator = original
    if not drawn:
        raise PacksimError("the trainer's training dataloader yielded no batch: give it a non-empty "
                           "train_dataset (after TRL's preparation and packing).")
    calls = recorder.calls  # the dataloader may collate one batch ahead; worker processes record none
    return [(b, calls[i] if i < len(calls) else None) for i, b in enumerate(drawn)]


def batch_fields(batch, what: str) -> dict:
    """``batch`` as a dict of fields with a tensor ``input_ids``, or PacksimError naming ``what`` it is."""
    fix = ("pass one collated training batch" if what == "batch=" else
           "the data collator must return one") + ", a dict with input_ids (B, T), as transformers' collators do"
    if not isinstance(batch, Mapping):
        raise PacksimError(f"{what} is a {type(batch).__name__}, not a dict of fields: {fix}.")
    if not isinstance(batch.get("input_ids"), torch.Tensor):
        got = "no input_ids" if "input_ids" not in batch else f"input_ids as a {type(batch['input_ids']).__name__}"
        raise PacksimError(f"{what} holds {got} (keys {sorted(map(str, batch))}): {fix}.")
    return dict(batch)


def _special_ids(trainer, model) -> tuple[set[int], set[int]]:
    """(bos, eos) of the trainer's tokenizer (or processor) and the model config."""
    sources = (getattr(trainer, "processing_class", None), getattr(model, "config", None))
    return token_ids("bos", *sources), token_ids("eos", *sources)


def _token_seq(trainer, model, ids: torch.Tensor, pad: torch.Tensor) -> torch.Tensor | None:
    """Example index (B, T) from the tokens, or None when the tokens mark nothing more than rows.

    The rule is :func:`packsim.core.special_tokens.example_starts`'s; what the trainer knows is
    whether an EOS ends every example: under TRL's wrapped packing it does (the token after a run
    of EOS starts the next example); otherwise a row holds one example and an EOS inside it ends a
    turn.
    """
    bos, eos = _special_ids(trainer, model)
    starts = example_starts(ids, ~pad, bos, eos, eos_starts=is_wrapped(trainer))  # (B, T)
    if starts is None or not bool(starts[:, 1:].any()):
        return None
    return seq_ids_from_starts(starts, ~pad)  # (B, T)


def batch_view(trainer, model, fields: dict) -> BatchView:
    ids = fields["input_ids"]
    found = find_boundaries(fields, missing="rows")
    field_seq = found.seq_ids.to(ids.device).clone()
    mask = fields.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and found.source == ROWS_SOURCE:
        field_seq[mask.to(ids.device) == 0] = -1
    view = BatchView(fields, field_seq, field_seq, found.source, False)
    if not view.multi_by_fields:
        tok = _token_seq(trainer, model, ids, field_seq < 0)
        if tok is not None:
            view.seq, view.from_tokens = tok, True
            view.source = "the tokens: a BOS, or the token after a run of EOS under wrapped packing, starts an example"
    bos = start_ids(*_special_ids(trainer, model))
    if bos:
        first = is_token(ids[:, 0], bos)
        view.rows_mid_example = int((~first & (field_seq[:, 0] >= 0)).sum())
    return view


def batch_evidence(trainer, model, view: BatchView, features) -> BoundaryEvidence:
    """Independent boundaries of the batch (the dataset's examples, else its tokens); sets ``view.seq``."""
    bos, eos = _special_ids(trainer, model)
    ids = view.fields["input_ids"]
    if view.from_tokens:  # the fields mark nothing inside rows (wrapped packing): the tokens decided
        view.independent = True
        return BoundaryEvidence(view.seq, view.source, [
            boundary_fields(view.fields, view.seq, view.source),
            special_tokens(ids, view.seq, start_ids(bos, eos), eos, False, "the tokens")])
    ev = collect(view.fields, view.field_seq, features, bos, eos, what="trainer's dataset examples of this batch")
    if ev.seq is not None:
        view.independent = True
        view.seq, view.source = ev.seq, f"{view.source}, confirmed by {ev.source}" if ev.confirms else ev.source
    else:
        view.source += f" ({ev.source}: the verdict rests on the batch's own metadata)"
    return ev


def response_mask(trainer, view: BatchView, features, objective: str = "sft") -> tuple[torch.Tensor | None, str | None]:
    """(B, T) bool response mask and where it came from, or (None, None) when unknown."""
    real = view.seq >= 0
    if objective == "lm":
        return real.clone(), "objective='lm' (every real token is a target)"
    if features is not None:
        try:
            flags = feature_response_masks(features)
        except PacksimError:
            flags = None
        if flags is not None:
            lengths = [len(f) for f in flags]
            B = real.shape[0]
            rows = [int(r.sum()) for r in real]
            if B == 1 and rows[0] == sum(lengths):
                layout = [sum(flags, [])]
            elif B == len(flags) and rows == lengths:
                layout = flags
            else:
                layout = None
            if layout is not None:
                mask = torch.zeros_like(real)
                for row, f in enumerate(layout):
                    mask[row, real[row]] = torch.tensor(f, dtype=torch.bool, device=mask.device)
                return mask, "the collated features' prompt/completion split"
    if sft_language_modelling(trainer):  # TRL's config says every token is a target
        return real.clone(), "language-modelling data (every token is a response token)"
    return None, None


def same_fields(rest: dict, fields: dict) -> bool:
    """Whether ``rest`` is ``fields`` without labels: the same keys and equal values (tensors by value)."""
    keys = set(fields) - {"labels"}
    if set(rest) != keys:
        return False
    for k in keys:
        a, b = rest[k], fields[k]
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                    and torch.equal(a, b.to(a.device))):
                return False
        elif a != b:
            return False
    return True


def is_wrapped(trainer) -> bool:
    """TRL's wrapped packing: examples are cut wherever a row ends."""
    args = trainer.args
    return bool(is_sft(trainer) and getattr(args, "packing", False)
                and getattr(args, "packing_strategy", "") == "wrapped")
