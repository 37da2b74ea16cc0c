"""Examples cut by truncation: a response cut short, or cut away so the example counts no label.

Two views of the same fault:

- :func:`truncated_records` (the pre-flight gate, which has the records): TRL's BFD packing
  truncates every tokenized example longer than ``max_length`` (``trl.data_utils._pack_bfd`` with
  ``on_seq_length_overflow="truncate"``), so a record of prompt + completion + EOS longer than it
  loses the end of its response, and one whose prompt alone fills it becomes a prompt-only row;
- :func:`examples_without_loss` (any trainer's batch): examples in the batch with no counted label
  inside them (labels (B, T) vs the example index (B, T)); a response cut away leaves exactly that.

Each returns a :class:`~packsim.auditing.report.Finding`. Used by :func:`packsim.audit_trainer` and
``packsim audit --model``.

Lessons: none directly.
"""

from __future__ import annotations

import torch

from packsim.auditing.report import Finding
from packsim.core.loss import IGNORE_INDEX

__all__ = ["examples_without_loss", "truncated_records"]


def truncated_records(lengths: list[tuple[int, int]], max_length: int | None) -> Finding:
    """``lengths``: (prompt tokens, prompt + completion + EOS tokens) per record; BFD keeps ``max_length``."""
    name = "truncation"
    if max_length is None:
        return Finding(name, "pass", f"no truncation: max_length is None ({len(lengths)} records kept whole)")
    cut = [k for k, (_, n) in enumerate(lengths) if n > max_length]
    if not cut:
        longest = max(n for _, n in lengths)
        return Finding(name, "pass", f"all {len(lengths)} records fit max_length={max_length} "
                                     f"(longest {longest} tokens)")
    prompt_only = sum(lengths[k][0] >= max_length for k in cut)
    longest = max(n for _, n in lengths)
    first = ", ".join(str(k + 1) for k in cut[:5]) + (" ..." if len(cut) > 5 else "")
    return Finding(name, "fail",
                   f"{len(cut)} of {len(lengths)} records are longer than max_length={max_length} tokens "
                   f"(records {first}; longest {longest}): TRL's BFD packing truncates them, cutting the end "
                   f"of the response and its EOS; {prompt_only} of them lose the whole response (prompt-only "
                   "rows that count no label)",
                   f"raise --max-length to at least {longest}, or drop or shorten the records longer than "
                   f"{max_length} tokens before training")


def examples_without_loss(labels, seq: torch.Tensor, cut_across_rows: bool = False) -> Finding:
    """Examples (at least 2 tokens) with no counted label inside them: seq (B, T) example index, -1 padding.

    A label at token t counts for example k when t and t - 1 both belong to k (the label at an
    example's first token is predicted from the previous example, or not at all).
    ``cut_across_rows``: the pipeline cuts examples wherever a row ends (TRL's wrapped packing), so
    a piece holding only prompt tokens is expected and says nothing about truncation: skipped.
    """
    name = "truncated_examples"
    if cut_across_rows:
        return Finding(name, "skipped", "wrapped packing cuts examples wherever a row ends (see wrapped_packing), "
                                        "so a piece without a counted label is not a sign of truncation")
    if labels is None:
        return Finding(name, "skipped", "the batch carries no labels, so examples without a counted label "
                                        "cannot be found")
    labels = torch.as_tensor(labels).reshape(seq.shape).to(seq.device)
    inside = (seq[:, 1:] == seq[:, :-1]) & (seq[:, 1:] >= 0)  # (B, T-1): token t + 1 follows t in one example
    counted = inside & (labels[:, 1:] != IGNORE_INDEX)
    S = int(seq.max()) + 1 if bool((seq >= 0).any()) else 0
    owner = seq[:, 1:]
    has_inside = torch.zeros(S, dtype=torch.bool, device=seq.device)
    has_label = torch.zeros(S, dtype=torch.bool, device=seq.device)
    if S:
        has_inside[owner[inside]] = True
        has_label[owner[counted]] = True
    empty = (has_inside & ~has_label).nonzero().flatten().tolist()
    if not empty:
        return Finding(name, "pass", f"each of the {int(has_inside.sum())} examples of 2+ tokens in the audited "
                                     "batch counts at least one label")
    listed = ", ".join(map(str, empty[:8])) + (" ..." if len(empty) > 8 else "")
    return Finding(name, "fail",
                   f"{len(empty)} of {int(has_inside.sum())} examples in the audited batch count no label "
                   f"(examples {listed}): prompt-only rows, as truncation at max_length leaves them when the "
                   "prompt fills it, or records without a response",
                   "raise max_length above the longest example, or drop the records longer than max_length "
                   "(and those without a response) before training")
