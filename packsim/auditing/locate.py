"""Where the examples a collator was given are in its batch: whole, or cut short.

:func:`feature_examples` reads the token ids of each example from the features (the trainer's
dataset items); :func:`locate` finds each as a contiguous run of ``input_ids``; :func:`locate_cut`
finds the ones not there whole as a prefix that stops where the example had to stop (a row's
end, padding, or the next example): the collator truncated them. The audit's independent
boundaries (:mod:`packsim.auditing.evidence`) and its truncation finding
(:mod:`packsim.auditing.truncation`) both read them. Shapes: ``seq`` (B, T) long example index,
-1 where no example was located.

Lessons: none directly (packsim.audit and packsim.audit_trainer call it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from packsim.core.errors import PacksimError
from packsim.core.token_example import id_list, read_example

__all__ = ["feature_examples", "locate", "locate_cut"]


def feature_examples(features) -> list[list[int]] | None:
    """The token ids of each example the collator was given, or None when the features do not say.

    A feature is a dict with ``input_ids`` (split by ``seq_lengths`` when the dataset was packed
    before collation, as TRL's ``pack_dataset`` does), a list of such dicts (one packed row: Axolotl's
    ``MultipackBatchSampler`` hands its collator a list of rows, each a list of examples), a dict in another form of
    :func:`packsim.core.token_example.read_example` (``prompt_ids`` + ``response_ids`` /
    ``completion_ids``), a list or tensor of ids, or an object with ``.tokens`` (a packsim
    Example). A feature in none of these forms, or whose ids are not ints, gives None.
    """
    if not features or isinstance(features, (Mapping, str, bytes)) or not isinstance(features, Sequence):
        return None
    try:
        out = []
        for f in features:
            if isinstance(f, Mapping) and "input_ids" in f:
                ids = id_list(f["input_ids"])
                lengths = id_list(f["seq_lengths"]) if f.get("seq_lengths") is not None else [len(ids)]
                if sum(lengths) != len(ids):
                    return None
                at = 0
                for n in lengths:
                    out.append(ids[at:at + n])
                    at += n
            elif isinstance(f, Sequence) and f and all(isinstance(x, Mapping) for x in f):  # one packed row
                row = feature_examples(f)
                if row is None:
                    return None
                out += row
            elif isinstance(f, Mapping):
                tokens = read_example(f)[0]
                if tokens is None:
                    return None
                out.append(tokens)
            elif isinstance(f, (Sequence, torch.Tensor)) and not isinstance(f, (str, bytes)):
                out.append(id_list(f.reshape(-1) if isinstance(f, torch.Tensor) else f))
            elif hasattr(f, "tokens"):
                out.append(id_list(f.tokens))
            else:
                return None
    except PacksimError:  # features the audit cannot read: no evidence from them
        return None
    return [e for e in out if e] or None


def locate(input_ids: torch.Tensor, examples: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
    """Find each example as a contiguous run of tokens: -> (seq (B, T), indices of examples not found).

    Examples are searched in order from where the previous one ended (collators keep the order),
    then anywhere still free; tokens no example covers get -1.
    """
    B, T = input_ids.shape
    rows = input_ids.tolist()
    seq = torch.full((B, T), -1, dtype=torch.long)
    used = [[False] * T for _ in range(B)]
    missing = []
    cur_r, cur_t = 0, 0
    for k, ex in enumerate(examples):
        n = len(ex)
        hit = _find(rows, used, ex, cur_r, cur_t) or _find(rows, used, ex, 0, 0)
        if hit is None:
            missing.append(k)
            continue
        r, t = hit
        seq[r, t:t + n] = k
        used[r][t:t + n] = [True] * n
        cur_r, cur_t = (r, t + n) if t + n < T else (r + 1, 0)
    return seq.to(input_ids.device), missing


def _find(rows, used, ex, r0: int, t0: int):
    n = len(ex)
    for r in range(r0, len(rows)):
        row, free = rows[r], used[r]
        for t in range(t0 if r == r0 else 0, len(row) - n + 1):
            if row[t] == ex[0] and not free[t] and row[t:t + n] == ex and not any(free[t:t + n]):
                return r, t
    return None


def locate_cut(input_ids: torch.Tensor, examples: list[list[int]], seq: torch.Tensor, missing: list[int],
               real: torch.Tensor | None = None) -> dict[int, int]:
    """Examples not found whole, found as a cut prefix: -> {example index: tokens kept}; fills ``seq``.

    ``seq`` (B, T) from :func:`locate`; ``real`` (B, T) bool, False on padding (None: no padding
    known). A prefix of ``m`` tokens (2 <= m < the example's length; 1 for a 2-token example)
    counts only where it stops at the row's end, before padding, before another located example or
    before a token that starts one of the missing examples (cut examples may follow each other):
    where a collator's truncation leaves it. The longest such prefix among the tokens no example
    covers is taken.
    """
    B, T = input_ids.shape
    rows = input_ids.tolist()
    taken = (seq >= 0).tolist()
    pad = [[False] * T for _ in range(B)] if real is None else (~real.bool()).tolist()
    firsts = {examples[k][0] for k in missing}  # where a cut example may start (the next one may be cut too)
    cut: dict[int, int] = {}
    for k in missing:
        ex, best = examples[k], None
        for r in range(B):
            row, used, padded = rows[r], taken[r], pad[r]
            for t in range(T):
                if used[t] or padded[t] or row[t] != ex[0]:
                    continue
                m = 1
                while m < len(ex) and t + m < T and not used[t + m] and not padded[t + m] and row[t + m] == ex[m]:
                    m += 1
                for stop in range(min(m, len(ex) - 1), 0, -1):  # the longest prefix that stops at a boundary
                    e = t + stop
                    if e == T or used[e] or padded[e] or row[e] in firsts:
                        if best is None or stop > best[2]:
                            best = (r, t, stop)
                        break
        if best is not None and (best[2] >= 2 or len(ex) == 2):
            r, t, m = best
            seq[r, t:t + m] = k
            taken[r][t:t + m] = [True] * m
            cut[k] = m
    return cut
