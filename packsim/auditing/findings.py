"""Configuration findings of a training pipeline: what in the trainer, the batch or the model breaks packing.

Each function returns a :class:`~packsim.auditing.report.Finding` (pass / fail / skipped, the
evidence, the fix). They read a :class:`BatchView`: the collated batch (input_ids (B, T)), where
its own fields put the examples, and where the tokens put them. Rules quote the installed
transformers source they come from; what cannot be checked here is ``skipped``, never ``pass``.
The loss settings' findings (completion-only loss, normalisation across devices) are in
:mod:`packsim.auditing.loss_findings`. Used by :func:`packsim.audit_trainer` and ``packsim audit --model`` (lesson 07).

Lessons: none directly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from packsim.auditing.report import Finding
from packsim.core.segments import run_cu_seqlens, run_starts
from packsim.core.special_tokens import is_token, start_ids, token_ids

_MASKING_IMPLS = ("eager", "sdpa", "flex_attention")  # transformers' masking_utils builds their masks
_FA_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


@dataclass
class BatchView:
    """One collated batch as the findings read it.

    fields: the collator's dict (input_ids (B, T), ...). seq (B, T): example index per token
    (-1 padding) the audit uses. field_seq (B, T): the examples the batch's own fields mark
    (cu_seq_lens_q > seq_idx > position_ids restarts; one per row without them). source: where
    ``seq`` came from. from_tokens: ``seq`` came from BOS/EOS tokens because the fields mark at
    most one example per row. rows_mid_example: rows whose first token is not BOS (BOS known; what
    the report says of it is :func:`rows_mid_example`'s). independent: ``seq`` came from evidence the
    collator did not write (the dataset's examples, or the tokens).
    """

    fields: dict
    seq: torch.Tensor
    field_seq: torch.Tensor
    source: str
    from_tokens: bool
    rows_mid_example: int = 0
    independent: bool = False

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.fields["input_ids"].shape)

    @property
    def multi_by_fields(self) -> bool:
        """Some row holds several examples according to the batch's own fields (a padding-free batch)."""
        return _max_per_row(self.field_seq) > 1

    @property
    def restarts(self) -> int:
        """How many examples start after a row's first token, by the batch's own fields."""
        s = self.field_seq  # (B, T) example id per token, -1 padding
        return int((run_starts(s)[:, 1:] & (s[:, 1:] >= 0)).sum())


def _max_per_row(seq: torch.Tensor) -> int:
    return max((len(torch.unique(row[row >= 0])) for row in seq), default=0)


def is_flash(impl: str | None) -> bool:
    """flash_attention_2/3 and the hub flash kernels (``kernels-community/flash-attn*``)."""
    return bool(impl) and "flash" in impl


def is_sft(trainer) -> bool:
    return any(c.__name__ == "SFTTrainer" for c in type(trainer).__mro__)


# ----------------------------------------------------------------------------- packing


def rows_mid_example(trainer, view: BatchView) -> str:
    """", k of B rows start in the middle of an example (...)" when the batch shows it, else "".

    Only where the tokens located the examples (``view.from_tokens``: nothing else marks them) and
    the BOS really starts examples in this batch: a row whose first token is not that BOS then
    begins with the rest of an example cut at the previous row's end. Examples located whole (the
    dataset's, or the fields') start their rows; a BOS id the tokenizer never puts in front says
    nothing.
    """
    if not view.from_tokens:
        return ""
    bos = start_ids(token_ids("bos", getattr(trainer, "processing_class", None),
                              getattr(getattr(trainer, "model", None), "config", None)),
                    token_ids("eos", getattr(trainer, "processing_class", None),
                              getattr(getattr(trainer, "model", None), "config", None)))
    ids, real = view.fields["input_ids"], view.seq >= 0
    is_bos = is_token(ids, bos).to(real.device) & real  # (B, T)
    n_bos = int(is_bos.sum())
    if not n_bos:
        return ""
    rows = real[:, 0]
    mid = int((rows & ~is_bos[:, 0]).sum())
    if not mid:
        return ""
    return (f", {mid} of {int(rows.sum())} row(s) start in the middle of an example (their first token is not "
            f"a BOS, while {n_bos} example(s) in the batch start with one)")


def wrapped_packing(trainer, view: BatchView) -> Finding:
    args = trainer.args
    B, T = view.shape
    n = int(view.seq.max()) + 1 if bool((view.seq >= 0).any()) else 0
    where = f"the audited batch: {B} row(s) of {T} tokens hold {n} examples ({view.source}){rows_mid_example(trainer, view)}"
    fix = ("use packing_strategy='bfd' (TRL's default: whole examples, padding-free, with "
           "position_ids and cu_seq_lens_*), or packing=False")
    if is_sft(trainer) and getattr(args, "packing", False) and getattr(args, "packing_strategy", "") == "wrapped":
        return Finding("wrapped_packing", "fail",
                       f"SFTConfig(packing=True, packing_strategy='wrapped') concatenates the examples "
                       f"and cuts the stream every max_length={args.max_length} tokens, with nothing in "
                       f"the batch marking where an example starts; {where}", fix)
    if view.from_tokens and _max_per_row(view.seq) > 1:
        return Finding("wrapped_packing", "fail",
                       f"several examples share a row and no position_ids, seq_idx or cu_seq_lens_* mark "
                       f"where they start (concatenate-and-cut packing); {where}", fix)
    return Finding("wrapped_packing", "pass",
                   f"no row holds examples the batch does not mark; {where}")


def padding_free_attention(view: BatchView, impl: str | None) -> Finding:
    """Can this attention implementation, on the installed transformers, isolate padding-free rows?"""
    import transformers
    from transformers import masking_utils

    if not view.multi_by_fields:
        return Finding("padding_free_attention", "pass",
                       "not a padding-free batch: no row holds several examples marked by position_ids, "
                       "seq_idx or cu_seq_lens_*")
    if is_flash(impl):
        f = flash_rows(view, impl)
        return Finding("padding_free_attention", f.status, f.evidence, f.fix)
    if impl == "packsim":
        return Finding("padding_free_attention", "pass",
                       "attn_implementation='packsim' reads cu_seq_lens_q, else position_ids restarts "
                       "(packsim.core.model)")
    base = (impl or "").split("|")[-1]  # "paged|sdpa" -> "sdpa"
    if base in _MASKING_IMPLS:
        if hasattr(masking_utils, "find_packed_sequence_indices"):
            return Finding("padding_free_attention", "pass",
                           f"transformers {transformers.__version__} builds a per-example mask for "
                           f"{impl!r} from position_ids (masking_utils.find_packed_sequence_indices, "
                           "called when attention_mask is None and no cache is in play: see the "
                           "attention_mask and cache findings)")
        return Finding("padding_free_attention", "fail",
                       f"transformers {transformers.__version__} has no masking_utils."
                       f"find_packed_sequence_indices, so {impl!r} applies one causal mask to each row",
                       "upgrade transformers, or use flash_attention_2 with cu_seq_lens_*")
    return Finding("padding_free_attention", "skipped",
                   f"attn_implementation={impl!r} is not one the static rules know; the perturbation "
                   "probe measured whether this forward isolates the examples")


def attention_mask(view: BatchView, impl: str | None) -> Finding:
    mask = view.fields.get("attention_mask")
    if mask is None:
        return Finding("attention_mask", "pass", "no attention_mask in the batch")
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        return Finding("attention_mask", "skipped",
                       "a custom (4D) attention_mask decides the attention itself: no static rule; the "
                       "perturbation probe measured it")
    if not view.multi_by_fields:
        return Finding("attention_mask", "pass",
                       "attention_mask marks padding only: no row holds several examples by position_ids")
    fix = ("drop attention_mask from the batch (DataCollatorWithFlattening and TRL's padding_free "
           "collator leave it out)")
    ones = bool((mask != 0).all())
    if is_flash(impl):
        if ones:
            return Finding("attention_mask", "pass",
                           "an all-ones 2D mask next to packed position_ids: masking_utils."
                           "flash_attention_mask returns None for it, so flash reads the boundaries")
        return Finding("attention_mask", "fail",
                       "a 2D attention_mask with zeros next to packed position_ids: _flash_attention_forward "
                       "unpads from the mask (modeling_flash_attention_utils._upad_input) and ignores "
                       "position_ids and cu_seq_lens_*", fix)
    return Finding("attention_mask", "fail",
                   f"an {'all-ones ' if ones else ''}attention_mask sits next to position_ids that restart "
                   f"{view.restarts} time(s) inside rows: transformers looks for packed sequences only when "
                   "attention_mask is None (masking_utils._preprocess_mask_arguments), so "
                   f"{impl!r} applies one causal mask per row", fix)


def cache(view: BatchView, cache_obj, use_cache, where: str) -> Finding:
    if cache_obj is None:
        return Finding("cache", "pass", f"the forward created no cache (use_cache={use_cache!r} {where})")
    made = f"the forward returned a {type(cache_obj).__name__} (use_cache={use_cache!r} {where})"
    fix = ("pass use_cache=False: TrainingArguments(use_cache=False), the default, sets "
           "model.config.use_cache; SFTTrainer passes it in compute_loss")
    if view.multi_by_fields:
        return Finding("cache", "fail",
                       f"{made}: with a cache transformers skips packed-sequence detection "
                       "(masking_utils._preprocess_mask_arguments checks cache is None)", fix)
    return Finding("cache", "pass", f"{made}, but no row holds several examples: it costs memory only")


def flash_rows(view: BatchView, impl: str | None) -> Finding:
    """Several packed rows on a flash path without cu_seq_lens_*.

    Rule from transformers/modeling_flash_attention_utils.py: ``_flash_attention_forward`` uses
    cu_seq_lens_* when all four varlen kwargs are given; otherwise ``_is_packed_sequence(position_ids,
    batch_size)`` returns False whenever ``batch_size != 1``, and each row runs as one causal sequence.
    """
    B, _ = view.shape
    if not is_flash(impl):
        return Finding("flash_rows", "pass", f"attn_implementation={impl!r} is not a flash path")
    if not view.multi_by_fields:
        return Finding("flash_rows", "pass", "no row holds several examples")
    if all(view.fields.get(k) is not None for k in _FA_KEYS):
        return Finding("flash_rows", "pass",
                       "cu_seq_lens_q/k and max_length_q/k are given: flash runs varlen over them "
                       "(modeling_flash_attention_utils._flash_attention_forward)")
    if B == 1:
        return Finding("flash_rows", "pass",
                       "one row: _is_packed_sequence(position_ids, batch_size=1) finds the examples from "
                       "position_ids (modeling_flash_attention_utils)")
    return Finding("flash_rows", "fail",
                   f"{B} rows with position_ids that restart and no cu_seq_lens_*: "
                   "modeling_flash_attention_utils._is_packed_sequence returns False when batch_size != 1, "
                   f"so {impl} runs each row as one causal sequence",
                   "flatten the batch into one row (DataCollatorWithFlattening, TRL padding_free) or pass "
                   "cu_seq_lens_q/k and max_length_q/k over the flattened tokens")


def flash_fields(fields, seq: torch.Tensor | None = None) -> Finding:
    """The varlen fields against each other, before any forward: ``max_length_q/k`` below the longest
    segment of ``cu_seq_lens_q/k`` (flash-attn sizes its grid by them and silently leaves the rest of
    a longer segment uncomputed; packsim's reference kernel raises), or ``cu_seq_lens_*`` offsets that
    are not where ``position_ids`` restart (the kernel attends over segments the positions disagree with).

    ``seq`` (1, T): where independent evidence put the examples. Offsets that are exactly its
    examples are right whatever the positions say: the disagreement is then the positions', which the
    positions probe judges by what they do (a model that reads them only relatively, or not at all,
    computes the same), and this finding passes saying so."""
    given = [k for k in _FA_KEYS if fields.get(k) is not None]
    if not given:
        return Finding("flash_fields", "pass", "no cu_seq_lens_* / max_length_* in the batch")
    problems, notes = [], []
    examples = None if seq is None or seq.shape[0] != 1 else run_cu_seqlens(seq.reshape(-1)).tolist()
    for side in ("q", "k"):
        cu, most = fields.get(f"cu_seq_lens_{side}"), fields.get(f"max_length_{side}")
        if cu is None:
            continue
        cu = torch.as_tensor(cu).reshape(-1).long()
        longest = int((cu[1:] - cu[:-1]).max()) if cu.numel() > 1 else 0
        if most is not None and int(most) < longest:
            problems.append(f"max_length_{side}={int(most)} but the longest segment of cu_seq_lens_{side} "
                            f"holds {longest} tokens (stale)")
        pos = fields.get("position_ids")
        if pos is not None and torch.as_tensor(pos).shape[0] == 1:
            row = torch.as_tensor(pos).reshape(-1)  # (T,): one flattened row
            restarts = [0, *((row[1:] <= row[:-1]).nonzero()[:, 0] + 1).tolist(), row.numel()]
            if cu.tolist() == restarts:
                continue
            if cu.tolist() == examples:
                notes.append(f"cu_seq_lens_{side} holds the examples' offsets; position_ids do not restart at "
                             "them (the positions probe judges what that does)")
            else:
                problems.append(f"cu_seq_lens_{side} {cu.tolist()[:8]} disagrees with where position_ids "
                                f"restart {restarts[:8]}")
    if not problems:
        return Finding("flash_fields", "pass", "; ".join(notes) if notes else
                       f"{', '.join(given)} agree with each other and with position_ids")
    return Finding("flash_fields", "fail", "inconsistent boundary fields: " + "; ".join(problems) +
                   ": a flash-attn varlen kernel runs over them as given, and computes the wrong attention "
                   "without an error", "recompute cu_seq_lens_q/k and max_length_q/k from the same position_ids "
                   "the batch carries, after any truncation (DataCollatorWithFlattening(return_flash_attn_kwargs=True))")


def static_findings(trainer, view: BatchView, impl: str | None) -> list[Finding]:
    """The findings read from the trainer and one batch (no forward needed); ``flash_fields`` where
    the batch carries varlen fields."""
    found = [wrapped_packing(trainer, view), padding_free_attention(view, impl),
             attention_mask(view, impl), flash_rows(view, impl)]
    if not has_flash_fields(view.fields):
        return found
    return found + [flash_fields(view.fields, view.seq if view.independent else None)]


def has_flash_fields(fields) -> bool:
    return any(fields.get(k) is not None for k in _FA_KEYS)
