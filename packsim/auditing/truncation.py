"""Examples cut by truncation: a response cut short, or cut away so the example counts no label.

Views of the same fault:

- :func:`truncated_records` (the pre-flight gate, which has the records): TRL's BFD packing
  truncates every tokenized example longer than ``max_length`` (``trl.data_utils._pack_bfd`` with
  ``on_seq_length_overflow="truncate"``), so a record of prompt + completion + EOS longer than it
  loses the end of its response, and one whose prompt alone fills it becomes a prompt-only row;
- :func:`dataset_cuts` (the trainer's own dataset, after its preparation): TRL truncates while it
  prepares the dataset (``SFTTrainer._prepare_dataset``: ``truncate`` without packing, ``pack_dataset``
  with it), so the records are gone; an example exactly ``max_length`` tokens long that does not
  end with the token the dataset's other examples end with (EOS) is one it cut;
- :func:`collator_cuts` (the collator's features vs its batch): an example the collator was given
  found in the batch only as a prefix that stops at a row's end, padding or the next example;
- :func:`examples_without_loss` (any trainer's batch): examples in the batch with no counted label
  inside them (labels (B, T) vs the example index (B, T)); a response cut away leaves exactly that.

:func:`truncated_examples` joins the last three into the ``truncated_examples`` finding of
:func:`packsim.audit_trainer` (so of ``packsim audit --trainer`` and ``packsim.AuditCallback``);
``packsim audit --model`` reports :func:`truncated_records`.

Lessons: none directly.
"""

from __future__ import annotations

from collections import Counter

import torch

from packsim.auditing.locate import feature_examples, locate, locate_cut
from packsim.auditing.report import Finding
from packsim.core.loss import IGNORE_INDEX
from packsim.core.special_tokens import token_ids
from packsim.core.token_example import id_list

__all__ = ["collator_cuts", "dataset_cuts", "examples_without_loss", "truncated_examples", "truncated_records"]

SCAN_ROWS = 50_000  # rows of the trainer's dataset read for dataset_cuts (the first ones)


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


def _first(ks: list[int]) -> str:
    return ", ".join(map(str, ks[:5])) + (" ..." if len(ks) > 5 else "")


def _examples_arrow(dataset, n: int):
    """(lengths, last tokens, counted(k) -> bool | None) of the first ``n`` rows, read as Arrow arrays."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    keep = [c for c in ("input_ids", "seq_lengths", "labels") if c in dataset.column_names]
    table = dataset.select_columns(keep).with_format("arrow")[:n]
    lengths, lasts, where = [], [], []  # where: (labels of the record batch or None, start) per example
    for rb in table.to_batches():
        ids = rb.column(rb.schema.get_field_index("input_ids"))
        row_len = pc.list_value_length(ids).to_numpy(zero_copy_only=False)
        ex_len = row_len
        if "seq_lengths" in keep:
            packed = pc.list_flatten(rb.column(rb.schema.get_field_index("seq_lengths"))).to_numpy(zero_copy_only=False)
            ex_len = packed if int(packed.sum()) == int(row_len.sum()) else row_len
        ex_len = ex_len[ex_len > 0].astype(np.int64)
        ends = np.cumsum(ex_len)
        if not len(ends):
            continue
        flat = pc.list_flatten(ids)
        lasts.append(pc.take(flat, pa.array(ends - 1)).to_numpy(zero_copy_only=False))
        lengths.append(ex_len)
        labels = pc.list_flatten(rb.column(rb.schema.get_field_index("labels"))) if "labels" in keep else None
        where += [(labels, int(s)) for s in ends - ex_len]
    if not lengths:
        return None
    lengths, lasts = np.concatenate(lengths).tolist(), np.concatenate(lasts).tolist()

    def counted(k):
        labels, s = where[k]
        if labels is None:
            return None
        piece = labels.slice(s + 1, lengths[k] - 1)
        return bool(len(piece)) and bool(pc.any(pc.not_equal(piece, IGNORE_INDEX)).as_py())

    return lengths, lasts, counted


def _examples_loop(dataset, n: int):
    """The same for any indexable dataset of dicts (a Python loop over its first ``n`` items)."""
    lengths, lasts, labels_of = [], [], []
    for i in range(n):
        item = dataset[i]
        if not hasattr(item, "get") or item.get("input_ids") is None:
            return None
        ids = id_list(item["input_ids"], f"dataset item {i}['input_ids']")
        sl, labels = item.get("seq_lengths"), item.get("labels")
        parts = [int(v) for v in sl] if sl is not None and sum(int(v) for v in sl) == len(ids) else [len(ids)]
        at = 0
        for m in parts:
            if m:
                lengths.append(m)
                lasts.append(ids[at + m - 1])
                labels_of.append(None if labels is None else [int(v) for v in labels[at + 1:at + m]])
            at += m
    if not lengths:
        return None
    return lengths, lasts, lambda k: None if labels_of[k] is None else any(v != IGNORE_INDEX for v in labels_of[k])


def dataset_cuts(dataset, max_length: int | None, eos: set[int], limit: int = SCAN_ROWS) -> dict | None:
    """Examples of a tokenized dataset cut at ``max_length``; None when the dataset cannot be read.

    Rows with ``input_ids`` (split by ``seq_lengths`` when packed, as TRL packs them) and, when
    present, ``labels``. ``max_length`` None: the longest example's length (where a tokenizer's
    ``truncation=True`` leaves them). The ending token: EOS, or the one token at least 90% of the
    shorter examples end with; without such a convention nothing is judged (``"ending"`` None).
    Returns {"examples", "max_length", "given", "cut", "prompt_only", "ending", "rows", "capped"}.
    """
    try:
        total = len(dataset)
    except TypeError:  # an IterableDataset: not scanned
        return None
    arrow = hasattr(dataset, "with_format") and hasattr(dataset, "column_names")
    if arrow and "input_ids" not in (dataset.column_names or []):
        return None
    n = min(total, limit if arrow else limit // 10)
    read = _examples_arrow(dataset, n) if arrow else _examples_loop(dataset, n)
    if read is None:
        return None
    lengths, lasts, counted = read
    limit_len = max(lengths) if max_length is None else int(max_length)
    shorter = Counter(last for m, last in zip(lengths, lasts, strict=True) if m < limit_len)
    ending = set(eos)
    if shorter:
        token, count = shorter.most_common(1)[0]
        total_short = sum(shorter.values())
        if sum(c for t, c in shorter.items() if t in eos) < 0.9 * total_short:
            ending = {token} if count >= 0.9 * total_short else set()
    cut = [k for k, (m, last) in enumerate(zip(lengths, lasts, strict=True))
           if ending and m == limit_len and last not in ending]
    return {"examples": len(lengths), "max_length": limit_len, "given": max_length is not None, "cut": cut,
            "prompt_only": [k for k in cut if counted(k) is False], "ending": sorted(ending) or None,
            "ending_is_eos": bool(ending) and ending <= set(eos), "rows": n, "capped": n < total}


def collator_cuts(features, input_ids: torch.Tensor, labels, real: torch.Tensor | None,
                  eos: set[int] = frozenset()) -> dict | None:
    """Examples the collator was given vs its batch: which it kept only a prefix of; None without features.

    ``real`` (B, T) bool, False on padding (None: unknown); ``eos``: the EOS ids. Returns {"examples",
    "cut" {k: (kept, length)}, "prompt_only" (cut examples keeping no counted label), "unfound"
    (neither whole nor a prefix: tokens changed, not judged), "at_row_end" (cut examples whose kept
    piece ends a full row, where a truncation of the row leaves it), "lost_eos" (cut examples whose
    dropped end is their EOS alone), "longest" (the longest example given), "width" (T)}.
    """
    exs = feature_examples(features)
    if not exs:
        return None
    ids = torch.as_tensor(input_ids).cpu()
    seq, missing = locate(ids, exs)
    cut = locate_cut(ids, exs, seq, missing, None if real is None else real.cpu()) if missing else {}
    prompt_only = []
    if labels is not None:
        lab = torch.as_tensor(labels).reshape(ids.shape).cpu()
        for k in cut:
            mine = seq == k
            first = mine & ~torch.cat([torch.zeros_like(mine[:, :1]), mine[:, :-1]], 1)
            if not bool((lab[mine & ~first] != IGNORE_INDEX).any()):
                prompt_only.append(k)
    T = ids.shape[1]
    at_row_end = [k for k in cut if bool((seq[:, T - 1] == k).any())]
    lost_eos = [k for k, m in cut.items() if len(exs[k]) - m == 1 and exs[k][-1] in eos]
    return {"examples": len(exs), "cut": {k: (m, len(exs[k])) for k, m in cut.items()},
            "prompt_only": prompt_only, "unfound": len(missing) - len(cut), "at_row_end": at_row_end,
            "lost_eos": lost_eos, "longest": max(len(e) for e in exs), "width": T}


def _dataset_part(found: dict | None, sft_truncates: bool) -> tuple[str, str]:
    """(text, "fail" / "pass" / "skipped") for the trainer's dataset."""
    if found is None:
        return "the trainer's dataset was not read (no input_ids column, or not a sized dataset)", "skipped"
    n, L, cut = found["examples"], found["max_length"], found["cut"]
    scope = f"the first {found['rows']} rows of the trainer's dataset" if found["capped"] else "the trainer's dataset"
    at = f"max_length={L}" if found["given"] else f"{L} tokens, its longest example's length"
    if found["ending"] is None:
        return (f"{scope}: its examples shorter than {L} tokens end with different tokens, so a cut one "
                "cannot be told by its last token (not judged)"), "skipped"
    end = "EOS" if found["ending_is_eos"] else f"token {found['ending'][0]}, as the shorter ones do"
    if not cut:
        return f"{scope}: none of its {n} examples is cut at {at} (each ends with {end} or is shorter)", "pass"
    dropped = (" (TRL drops the examples its truncation left without a label, so those are not counted)"
               if sft_truncates else "")
    return (f"{scope}: {len(cut)} of {n} examples are cut at {at} (exactly {L} tokens, not ending with {end}; "
            f"examples {_first(cut)}), {len(found['prompt_only'])} of them keep no counted label "
            f"(prompt-only){dropped}"), "fail"


def _truncated_by_length(found: dict, k: int, max_length: int | None) -> bool:
    """Can a truncation at ``max_length`` (or, unknown, at a row's end) have cut example ``k``?"""
    _, n = found["cut"][k]
    if max_length is not None:  # longer than it, or kept to the end of a row max_length tokens long
        return n > max_length or (k in found["at_row_end"] and found["width"] >= max_length)
    return k in found["at_row_end"]  # the kept piece fills its row: a row cut at its length


def _collator_part(found: dict | None, max_length: int | None = None) -> tuple[str, str, set[str]]:
    """(text, status, causes) for the collator's features vs its batch; causes: ``"truncation"`` for
    cuts a max_length explains, ``"collator"`` for tokens dropped from examples that fit."""
    if found is None:
        return "", "skipped", set()
    cut, n = found["cut"], found["examples"]
    unfound = (f"; {found['unfound']} not found whole or as a prefix (their tokens changed: not judged)"
               if found["unfound"] else "")
    if not cut:
        return f"the collator: each of the {n} examples it was given is whole in the batch{unfound}", "pass", set()
    kept = "; ".join(f"example {k} keeps {m} of {total} tokens" for k, (m, total) in list(cut.items())[:3])
    text = (f"the collator: {len(cut)} of the {n} examples it was given are cut short in the batch "
            f"({kept}{' ...' if len(cut) > 3 else ''}), {len(found['prompt_only'])} of them keep no counted "
            f"label (prompt-only){unfound}")
    room = [k for k in cut if not _truncated_by_length(found, k, max_length)]
    if room and max_length is None:  # no limit known: a cut at a row's end losing what the others lose is theirs
        lost = {cut[k][1] - cut[k][0] for k in room}
        room = [k for k in cut if k in room or cut[k][1] - cut[k][0] in lost]
    causes = {"collator"} if room else set()
    if len(room) < len(cut):
        causes.add("truncation")
    if room:
        limit = f"max_length={max_length}" if max_length is not None else "the rows (each stops before padding or the next example)"
        eos = [k for k in room if k in found["lost_eos"]]
        what = (f"{len(eos)} of them lose only their last token, the EOS" if eos
                else f"{len(room)} of them lose tokens")
        text += (f"; {what}, while they fit {limit} (the longest example given is {found['longest']} tokens): "
                 "not a truncation")
    return text, "fail", causes


def _eos_ids(trainer) -> set[int]:
    return token_ids("eos", getattr(trainer, "processing_class", None),
                     getattr(getattr(trainer, "model", None), "config", None))


def truncated_examples(trainer, p, features, cut_across_rows: bool = False) -> Finding:
    """The ``truncated_examples`` finding of :func:`packsim.audit_trainer`: dataset, collator, batch.

    ``p``: the audited batch's :class:`~packsim.auditing.pipeline.Pipeline`; ``features``: what the
    collator was given for it (None when unseen). Fails when any of the three finds a cut example.
    """
    batch = examples_without_loss(p.labels, p.seq, cut_across_rows)
    if cut_across_rows:
        return batch
    args = getattr(trainer, "args", None)
    max_length = getattr(args, "max_length", None)
    if getattr(args, "truncation_mode", "keep_start") == "keep_end" and max_length is not None:
        data = ("the trainer's dataset: truncation_mode='keep_end' keeps each example's end (its response), "
                "so cuts at the front are not counted"), "skipped"
    else:
        sft = any(c.__name__ == "SFTTrainer" for c in type(trainer).__mro__)
        data = _dataset_part(dataset_cuts(getattr(trainer, "train_dataset", None), max_length, _eos_ids(trainer)),
                             sft and not getattr(args, "packing", False))
    fields = p.context.get("fields", {}) if isinstance(p.context, dict) else {}
    mask = fields.get("attention_mask")
    real = mask.bool() if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None
    limit = max_length if max_length is not None else getattr(getattr(trainer, "data_collator", None), "max_length", None)
    limit = limit if isinstance(limit, int) else None
    text, status, causes = _collator_part(collator_cuts(features, p.input_ids, p.labels, real, _eos_ids(trainer)), limit)
    parts = [data, (text, status), (f"the audited batch: {batch.evidence}", batch.status)]
    statuses = {s for t, s in parts if t}
    status = "fail" if "fail" in statuses else "pass" if "pass" in statuses else "skipped"
    if data[1] == "fail" or (batch.failed and "collator" not in causes):
        causes.add("truncation")
    fixes = []
    if "collator" in causes:
        fixes.append("fix the collator so it keeps every token of each example it is given, EOS included (an "
                     "off-by-one slice such as input_ids[:-1], or a shift done in the collator); raising max_length "
                     "does not help: the examples fit")
    if "truncation" in causes:
        fixes.append("raise max_length above the longest example (SFTConfig(max_length=...), or the collator's or "
                     "tokenizer's max_length), or drop or shorten the examples longer than it (and those without a "
                     "response) before training")
    return Finding("truncated_examples", status, "; ".join(t for t, _ in parts if t),
                   "; and ".join(fixes) if status == "fail" else "")
