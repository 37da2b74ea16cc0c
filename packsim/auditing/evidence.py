"""Where the examples of a batch are, from evidence the pipeline under audit did not produce.

The batch's boundary fields (``position_ids`` restarts, ``cu_seq_lens_q/k``, ``seq_idx``, a 4D
mask) are what the collator wrote; a collator whose ``position_ids`` restart one token late
writes wrong boundaries and a forward that follows them leaks. So the audit finds the examples
from independent evidence and checks every field against it:

1. **the examples themselves** (:mod:`packsim.auditing.locate`): the tokenized examples the
   collator was given (the trainer's dataset items; TRL's pre-packed rows are split by their
   ``seq_lengths``), each found as a contiguous run of ``input_ids`` in a row of the batch, or as
   a prefix the collator cut short;
2. **special tokens** (:func:`packsim.core.special_tokens.example_starts`, :func:`special_tokens`):
   a BOS (when it differs from EOS) starts an example; only without a BOS, the token after an EOS
   starts one (the rule and the conventions it covers are stated there). A BOS that does not
   start an example is a finding when no dataset evidence overrules it. Without a BOS, an
   EOS inside an example is one only when the EOS count ties to the example count (the EOS
   tokens cut the rows into as many pieces as the fields mark examples: a boundary moved by a
   token); a multi-turn chat template ends every turn with EOS, so more pieces than examples
   cannot tell turns from merged examples, and the tokens are then not independent evidence.

:func:`position_restarts` says how ``position_ids`` restart against the examples (one token early or
late, at wrong tokens, not at all), for the positions probe and its causes.
:func:`field_starts` reads every boundary field into (B, T) bool "an example starts here";
:func:`boundary_fields` compares each with the independent starts and names the field and the
token where they disagree ("position_ids restart at token 12, the example starts at token 11").
Where no independent evidence exists, the finding is ``skipped`` and says the verdict rests on
the batch's own metadata. :class:`BoundaryEvidence` holds the result (the name says which
evidence: :class:`packsim.experiment.forensics.Evidence` is the weights' evidence of a trained run).
Shapes: ``seq`` (B, T) long example index, -1 on padding.

Lessons: none directly (packsim.audit and packsim.audit_trainer call it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from packsim.auditing.locate import feature_examples, locate, locate_cut
from packsim.auditing.report import UNTIED_PIECES, Finding
from packsim.core import boundaries
from packsim.core.segments import run_starts, seq_ids_from_starts
from packsim.core.special_tokens import example_starts, is_token, start_ids, token_ids

__all__ = ["BoundaryEvidence", "boundary_fields", "collect", "dict_evidence", "field_starts",
           "position_restarts", "special_tokens"]

# field -> how the report says "an example starts here" for it
_VERB = {"position_ids": "restart", "cu_seq_lens_q": "has an offset", "cu_seq_lens_k": "has an offset",
         "seq_idx": "changes", "attention_mask (4D)": "blocks the previous token"}


@dataclass
class BoundaryEvidence:
    """Independent example boundaries of one batch, or why there are none.

    seq (B, T) long: example index per token (-1 padding or unlocated), None when no evidence;
    source: what it came from; findings: ``boundary_fields`` and ``special_tokens``.
    """

    seq: torch.Tensor | None
    source: str
    findings: list[Finding] = field(default_factory=list)
    confirms: bool = False  # the evidence marks exactly the examples the batch's fields mark
    cut: dict[int, int] = field(default_factory=dict)  # example index -> tokens the collator kept

    @property
    def independent(self) -> bool:
        return self.seq is not None


def field_starts(fields: Mapping, B: int, T: int) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    """Every boundary field the batch carries -> ((B, T) bool starts, (B, T) bool padding or None), read by
    :func:`packsim.core.boundaries.field_starts`; each row starts an example (a row of a batch is never
    the continuation of the row before it, whatever ``cu_seq_lens_*`` over the flattened rows say)."""
    out = boundaries.field_starts(fields, B, T)
    for key in ("cu_seq_lens_q", "cu_seq_lens_k"):
        if key in out:
            starts = out[key][0].clone()
            starts[:, 0] = True
            out[key] = (starts, out[key][1])
    return out


def _where(B: int, r: int, t: int) -> str:
    return f"token {t}" if B == 1 else f"row {r} token {t}"


def _disagreement(name: str, fstarts: torch.Tensor, istarts: torch.Tensor, real: torch.Tensor,
                  fpad, B: int) -> str | None:
    """One sentence on where field ``name`` and the independent starts differ, or None when they agree."""
    missing = istarts & ~fstarts & real  # an example starts, the field says it continues
    extra = fstarts & ~istarts & real  # the field starts one inside an example
    texts = []
    if fpad is not None and bool((fpad & real).any()):
        n = int((fpad & real).sum())
        texts.append(f"{name} leaves {n} token(s) of the examples out (it ends before the batch's "
                     "last example does)")
    n_bad = int(missing.sum()) + int(extra.sum())
    if not n_bad and not texts:
        return None
    verb = _VERB.get(name, "marks a start")
    if bool(missing.any()):
        r, s = (int(v) for v in missing.nonzero()[0])
        near = extra[r].nonzero().flatten()
        if near.numel():
            e = int(near[(near - s).abs().argmin()])
            texts.append(f"{name} {verb} at {_where(B, r, e)}, the example starts at {_where(B, r, s)}")
        else:
            texts.append(f"{name} does not mark the example that starts at {_where(B, r, s)}")
    elif bool(extra.any()):
        r, e = (int(v) for v in extra.nonzero()[0])
        texts.append(f"{name} {verb} at {_where(B, r, e)}, inside an example")
    return "; ".join(texts) + f" ({n_bad} token(s) where {name} and the examples disagree)"


def position_restarts(pos: torch.Tensor, seq: torch.Tensor) -> tuple[str, str]:
    """How ``pos`` (B, T) restarts against the examples of ``seq`` (B, T): (kind, sentence).

    kind: ``"right"`` (0 on each example's first token, +1 after), ``"early"`` / ``"late"`` (every
    wrong restart one token before / after the example's first token), ``"wrong"`` (restarts at
    other tokens), ``"across"`` (no restart where later examples start: one run per row),
    ``"values"`` (restarts where the examples do, from another value than 0).
    """
    real = seq >= 0
    B = seq.shape[0]
    ex = run_starts(seq) & real  # (B, T): an example starts here
    ps = run_starts(pos, step=1) & real  # (B, T): position_ids restart here (transformers' reading)
    missing, extra = ex & ~ps, ps & ~ex
    n_later = int(ex[:, 1:].sum())
    if not bool(missing.any()) and not bool(extra.any()):
        bad = ex & (pos != 0)
        if not bool(bad.any()):
            return "right", "restart at each example"
        r, t = (int(v) for v in bad.nonzero()[0])
        return "values", (f"restart where each example starts, but not from 0 ({int(bad.sum())} example(s); "
                          f"first: position {int(pos[r, t])} at {_where(B, r, t)})")
    shifts = []
    for r, t in missing.nonzero().tolist():
        near = extra[r].nonzero().flatten()
        shifts.append(int(near[(near - t).abs().argmin()]) - t if near.numel() else None)
    r, t = (int(v) for v in (missing if bool(missing.any()) else extra).nonzero()[0])
    if shifts and None not in shifts and set(shifts) in ({-1}, {1}) and int(extra.sum()) == len(shifts):
        kind = "early" if shifts[0] < 0 else "late"
        return kind, (f"restart one token {kind}: at {_where(B, r, t + shifts[0])}, where the example starts at "
                      f"{_where(B, r, t)} ({len(shifts)} of the {n_later} later examples' starts)")
    if not bool(extra.any()):
        return "across", (f"do not restart where {int(missing.sum())} of the {n_later} later examples start "
                          f"(first at {_where(B, r, t)}): each row counts on as one sequence")
    e = extra.nonzero()[0].tolist()
    return "wrong", (f"restart at the wrong tokens: {int(extra.sum())} restart(s) inside an example (first at "
                     f"{_where(B, e[0], e[1])}), {int(missing.sum())} example start(s) without one"
                     + (f" (first at {_where(B, r, t)})" if bool(missing.any()) else ""))


def boundary_fields(fields: Mapping, seq: torch.Tensor | None, source: str) -> Finding:
    """Compare every boundary field with the independent example starts of ``seq`` (B, T).

    Without ``seq`` the fields are compared with each other: two fields that disagree mean one
    is wrong, and the finding fails; when they agree it is ``skipped`` (nothing independent).
    """
    ids = fields["input_ids"]
    B, T = ids.shape
    found = field_starts(fields, B, T)
    if "position_ids" in found and not bool(found["position_ids"][0][:, 1:].any()):
        del found["position_ids"]  # 0..T-1 per row marks no boundary (positions for flash varlen)
    if seq is None:
        names = list(found)
        if len(names) < 2:
            return Finding("boundary_fields", "skipped",
                           f"no independent evidence of where the examples are ({source}): the verdict "
                           f"rests on the batch's own metadata ({', '.join(names) or 'no boundary field'})")
        ref, (rstarts, rpad) = names[0], found[names[0]]
        real = torch.ones(B, T, dtype=torch.bool, device=rstarts.device) if rpad is None else ~rpad
        bad = [t for n in names[1:] if (t := _disagreement(n, found[n][0], rstarts, real, None, B))]
        if bad:
            return Finding("boundary_fields", "fail",
                           f"the batch's boundary fields disagree with each other (read against {ref}): "
                           + "; ".join(bad), _FIX)
        return Finding("boundary_fields", "skipped",
                       f"no independent evidence of where the examples are ({source}); the batch's "
                       f"{', '.join(names)} agree with each other, so the verdict rests on the batch's "
                       "own metadata")
    real = seq >= 0
    istarts = run_starts(seq) & real
    if not found:
        return Finding("boundary_fields", "pass" if _one_per_row(seq) else "fail",
                       f"the batch carries no boundary field; {source}",
                       "" if _one_per_row(seq) else _FIX)
    bad = [t for n, (fs, fp) in found.items()
           if (t := _disagreement(n, fs.to(seq.device), istarts, real,
                                  None if fp is None else fp.to(seq.device), B))]
    n_ex = int(seq.max()) + 1 if bool(real.any()) else 0
    if bad:
        return Finding("boundary_fields", "fail", f"{source}; " + "; ".join(bad), _FIX)
    return Finding("boundary_fields", "pass",
                   f"{source}; {', '.join(found)} mark exactly these {n_ex} examples")


def _one_per_row(seq: torch.Tensor) -> bool:
    return all(len(torch.unique(r[r >= 0])) <= 1 for r in seq)


_FIX = ("rebuild every boundary field from the example lengths in one place (position_ids restart at 0 "
        "on each example's first token, cu_seq_lens_* = [0, cumsum(lengths)], seq_idx the example index): "
        "transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True) does")


def special_tokens(ids: torch.Tensor, seq: torch.Tensor, bos: set[int], eos: set[int],
                   judged: bool, what: str) -> Finding:
    """BOS / EOS against the examples of ``seq``: a BOS not starting one, an EOS inside one, counts.

    ``judged``: fail on a mismatch (no dataset evidence overrules the tokens); else report only.
    """
    if not bos and not eos:
        return Finding("special_tokens", "skipped", "neither the tokenizer nor the model config defines "
                       "a BOS or EOS token, so the tokens say nothing about where examples start")
    real = seq >= 0
    starts = run_starts(seq) & real
    ends = torch.zeros_like(starts)
    ends[:, :-1] = starts[:, 1:] | ~real[:, 1:]
    ends[:, -1] = True
    ends &= real
    n = int(starts.sum())
    parts, bad = [], []
    if bos:
        is_bos = is_token(ids, bos) & real
        lone = is_bos & ~starts
        parts.append(f"{int((is_bos & starts).sum())} of {n} examples start with BOS")
        if bool(lone.any()):
            r, t = (int(v) for v in lone.nonzero()[0])
            bad.append(f"{int(lone.sum())} BOS token(s) do not start an example (first at "
                       f"{_where(ids.shape[0], r, t)})")
    if eos:
        is_eos = is_token(ids, eos) & real
        inside = is_eos & ~ends
        inside[:, :-1] &= ~is_eos[:, 1:]  # a run of EOS (eos == pad) ends where its last token is
        parts.append(f"{int((is_eos & ends).sum())} of {n} examples end with EOS")
        if bool(inside.any()):
            r, t = (int(v) for v in inside.nonzero()[0])
            where = (f"{int(inside.sum())} EOS token(s) sit inside an example (first at "
                     f"{_where(ids.shape[0], r, t)})")
            # with a BOS marking the starts, an EOS inside an example is a turn's end, not a fault
            (parts if bos else bad).append(where)
    text = f"{what}: " + ", ".join(parts) + ("; " + "; ".join(bad) if bad else "")
    if bad and judged:
        return Finding("special_tokens", "fail",
                       text + " (a multi-turn chat template can put EOS inside an example: then pass "
                       "the examples to the audit)", "the batch's boundary fields merge or split "
                       "examples where the tokens do not: " + _FIX)
    return Finding("special_tokens", "pass", text)


def collect(fields: Mapping, field_seq: torch.Tensor, examples, bos: set[int], eos: set[int],
            what: str = "examples given") -> BoundaryEvidence:
    """The independent boundaries of one batch and the ``boundary_fields`` / ``special_tokens`` findings.

    ``field_seq`` (B, T): the examples the batch's own fields mark (-1 padding). ``examples``:
    the examples the collator was given (see :func:`~packsim.auditing.locate.feature_examples`), or
    None. Without them and without a BOS, the EOS tokens are evidence only where their count ties
    to the fields' example count (one EOS run per example); else ``special_tokens`` is skipped.
    """
    ids = fields["input_ids"]
    exs = feature_examples(examples)
    if exs:
        seq, missing = locate(ids, exs)
        cut = locate_cut(ids, exs, seq, missing, field_seq >= 0) if missing else {}
        if len(cut) == len(missing):
            src = f"the {what} ({len(exs)} examples located as contiguous runs of input_ids" + (
                f"; {len(cut)} of them cut short by the collator, located by the tokens it kept)" if cut else ")")
            return BoundaryEvidence(seq, src, [boundary_fields(fields, seq, src),
                                       special_tokens(ids, seq, bos, eos, False, "the located examples")], cut=cut)
        first = next(k for k in missing if k not in cut)
        note = (f"{len(missing) - len(cut)} of {len(exs)} {what} are not contiguous runs of the batch's "
                f"input_ids (first: example {first}; the collator changed their tokens)")
    else:
        note = f"no {what}"
    bos = start_ids(bos, eos)
    real = field_seq >= 0
    what_tok = "the tokens vs the examples the batch's fields mark"
    tok = special_tokens(ids, field_seq, bos, eos, True, what_tok)
    starts = example_starts(ids, real, bos, eos)
    if tok.failed and not bos and starts is not None:
        n_tok, n_fields = int((starts & real).sum()), int((run_starts(field_seq) & real).sum())
        if n_tok != n_fields:  # several EOS per example: turns or merged examples, the tokens cannot tell
            text = special_tokens(ids, field_seq, bos, eos, False, what_tok).evidence
            tok = Finding("special_tokens", "skipped", _untied(text, n_tok, n_fields))
            note += (f"; the EOS tokens mark {n_tok} {UNTIED_PIECES} {n_fields} examples, so "
                     "they are not independent evidence")
            return BoundaryEvidence(None, note, [boundary_fields(fields, None, note), tok])
    if tok.failed and starts is not None:
        seq = seq_ids_from_starts(starts, real)
        src = (f"the special tokens ({note}): " + ("a BOS starts an example" if bos else
               "the token after an EOS starts an example") + ", where the batch's fields say otherwise")
        return BoundaryEvidence(seq, src, [boundary_fields(fields, seq, src), tok])
    if starts is not None and bool(torch.equal(starts & real, run_starts(field_seq) & real)):
        # the tokens alone mark the same examples: a BOS starts each, or an EOS ends each
        seq = seq_ids_from_starts(starts, real)
        src = ("the special tokens (a BOS starts every example or an EOS ends every one, and nowhere "
               f"else; {note})")
        return BoundaryEvidence(seq, src, [boundary_fields(fields, seq, src), tok], confirms=True)
    return BoundaryEvidence(None, note, [boundary_fields(fields, None, note), tok])


def _untied(text: str, n_tok: int, n_fields: int) -> str:
    return (f"{text}; without a BOS the EOS tokens split the rows into {n_tok} pieces where the batch's "
            f"fields mark {n_fields} examples, so the EOS count cannot be tied to the example count (a "
            "multi-turn chat template ends every turn with EOS; merged examples look the same): the tokens "
            "are not independent evidence here and the verdict rests on the batch's own metadata. To check "
            "the boundaries, pass the examples (packsim.audit(..., examples=...); audit_trainer reads them "
            "from the trainer's dataset)")


def pad_id(config) -> int | None:
    """The model's pad token where it can mark padding by itself (a run of it ending a row, no label
    counted: Axolotl's ``pad_to_sequence_len``), or None: none set, or it is also a BOS / EOS (then a
    trailing run of it may be the last example's own end)."""
    pad = token_ids("pad", config)
    if len(pad) != 1 or pad & (token_ids("bos", config) | token_ids("eos", config)):
        return None
    return next(iter(pad))


def dict_evidence(model, batch: Mapping, examples=None) -> BoundaryEvidence:
    """:func:`collect` for ``packsim.audit(model, batch, examples=...)``; special ids from model.config."""
    config = getattr(model, "config", None)
    found = boundaries.find_boundaries(batch, missing="rows", pad_token_id=pad_id(config))
    field_seq = found.seq_ids.to(batch["input_ids"].device)
    ev = collect(batch, field_seq, examples, token_ids("bos", config), token_ids("eos", config))
    if ev.seq is None:
        return BoundaryEvidence(None, found.source + f" ({ev.source}: the verdict rests on the batch's own metadata)",
                        ev.findings)
    if ev.confirms:
        ev.source = f"{found.source}, confirmed by {ev.source}"
    return ev
