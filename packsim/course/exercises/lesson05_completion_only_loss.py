"""Checks for the exercises of notebook 05_completion_only_loss.

- :func:`check_completion_labels`: one packed row (T,), its example lengths and prompt lengths ->
  completion-only labels (the learner derives the roles);
- :func:`check_per_token_loss`: per-token losses of several micro-batches -> the loss of the
  optimiser step, normalised per response token;
- :func:`check_correct_row`: which of four candidate label rows (:func:`label_candidates`,
  printed by :func:`show_candidates`) is the right one;
- :func:`check_response_start`: the joint token ids of prompt + response and the prompt's own ids
  (lists of ints, from the lesson's BPE tokenizer :func:`lesson_bpe`) -> the index of the first
  token that holds a response character, also when a merge crosses the boundary
  (:func:`boundary_cases`).

The checks compare with answers computed independently: :func:`packsim.core.loss.make_labels` on
packs built by :class:`packsim.PackedBatch`, plain sums over the token losses, and the BPE's
character offsets. Values are judged, not forms: labels in place or not, any formula; a loss as a
float, 0-d tensor or numpy scalar within 1e-6 relative or 5e-5 absolute (4 decimals); the letter
in any case; the start index as any integer (an int, numpy or 0-d tensor integer).
"""

from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass

import torch
from tokenizers import Tokenizer, models, trainers

from packsim.core.batch import PackedBatch
from packsim.core.data import make_examples
from packsim.core.loss import IGNORE_INDEX, Role, make_labels
from packsim.core.tokenizer import build_tokenizer
from packsim.course.exercises import Feedback, check, fail, ok

__all__ = [
    "check_completion_labels",
    "check_per_token_loss",
    "check_correct_row",
    "CORRECT_LETTER",
    "label_batch",
    "row_layout",
    "label_candidates",
    "show_candidates",
    "LOSS_CASES",
    "check_response_start",
    "lesson_bpe",
    "boundary_cases",
    "TEMPLATE",
]


def label_batch() -> PackedBatch:
    """The packs :func:`check_completion_labels` tries: 8 examples in 4 rows of 40 tokens.

    Every role occurs: first token of a row, boundary, prompt, response, EOS and padding.
    """
    return PackedBatch.from_examples(make_examples(8, seed=1), capacity=40, setup="correct")


def _label_mistakes(got: torch.Tensor, roles: torch.Tensor) -> list[str]:
    """What is wrong with labels ``got`` (B, T), by role; the first token of a row never counts."""
    counted = got != IGNORE_INDEX  # (B, T)
    target = torch.ones_like(counted)
    target[:, 0] = False  # the first token of a row is never a target: anything goes there
    problems = []
    for role in (Role.PROMPT, Role.BOUNDARY, Role.PAD):
        where = (roles == role) & target & counted
        if bool(where.any()):
            problems.append(f"you kept {int(where.sum())} {role.label} token(s)")
    for role in (Role.RESPONSE, Role.EOS):
        where = (roles == role) & ~counted
        if bool(where.any()):
            problems.append(f"you dropped {int(where.sum())} {role.label} token(s)")
    return problems


_MISTAKE_HINTS = {
    "prompt": "the prompt is the model's input, not something it should learn to write: set "
    "its labels to -100.",
    "boundary": "a boundary token is an example's first token: counting it trains the previous "
    "example's EOS to predict it (here <bos>, since every packsim example starts with one; with a "
    "tokenizer that adds no BOS, such as Qwen's, the next example's first prompt token). Set it to -100.",
    "padding": "padding is not data: set its labels to -100.",
    "response": "the response is what fine-tuning is for: keep its labels.",
    "EOS": "keep the EOS label: it is how the model learns to stop answering.",
}


def row_layout(batch: PackedBatch, row: int) -> tuple[list[int], list[int]]:
    """(lengths, prompt_lengths) of the examples of one packed row, in order, from its roles.

    An example's prompt counts its <bos> (role FIRST or BOUNDARY) and its PROMPT tokens; its length
    adds the RESPONSE tokens and the EOS. Padding follows the last example.
    """
    seq, roles = batch.seq_ids[row], batch.roles[row]  # (T,)
    lengths, prompts = [], []
    for sid in seq[seq >= 0].unique_consecutive().tolist():
        mine = roles[seq == sid]
        lengths.append(int(mine.numel()))
        prompts.append(int(((mine == Role.PROMPT) | (mine == Role.BOUNDARY) | (mine == Role.FIRST)).sum()))
    return lengths, prompts


def _no_offsets(ids: torch.Tensor, lengths, prompts) -> torch.Tensor:
    """The slip of placing every example at position 0 (no running offset)."""
    out = torch.full_like(ids, IGNORE_INDEX)
    for n, p in zip(lengths, prompts, strict=True):
        out[p:n] = ids[p:n]
    return out


@check("completion-only labels")
def check_completion_labels(fn) -> Feedback:
    """``fn(input_ids (T,) long, lengths list[int], prompt_lengths list[int]) -> labels (T,) long``."""
    batch = label_batch()
    for row in range(batch.input_ids.shape[0]):
        ids, roles = batch.input_ids[row], batch.roles[row]  # (T,)
        lengths, prompts = row_layout(batch, row)
        where = f"for row {row} (lengths {lengths}, prompt lengths {prompts}, {ids.numel()} tokens)"
        got = fn(ids.clone(), list(lengths), list(prompts))
        if not isinstance(got, torch.Tensor):
            return fail(f"{where} you returned a {type(got).__name__}, not a torch.Tensor.",
                        "start from torch.full_like(input_ids, -100) and copy the counted tokens.")
        if tuple(got.shape) != tuple(ids.shape):
            return fail(f"{where} your labels have shape {tuple(got.shape)}; input_ids has "
                        f"{tuple(ids.shape)}.",
                        "labels are aligned with input_ids (same shape); the model shifts them itself.")
        if got.dtype != torch.long:
            return fail(f"{where} your labels have dtype {got.dtype}; cross_entropy needs torch.long.",
                        "use torch.full_like(input_ids, -100), then copy token ids into it.")
        want = make_labels(ids[None], roles[None], "completion")[0]  # (T,)
        if torch.equal(got[1:], want[1:]):
            continue
        if len(lengths) > 1 and torch.equal(got[1:], _no_offsets(ids, lengths, prompts)[1:]):
            return fail(f"{where} you placed every example at position 0: example i starts at "
                        "sum(lengths[:i]), not at 0.",
                        "keep a running offset: start = 0; after each example, start += length.")
        shifted = torch.full_like(want, IGNORE_INDEX)
        shifted[:-1] = want[1:]
        if torch.equal(got[1:], shifted[1:]):
            return fail(f"{where} your labels are shifted by one: labels[t] holds input_ids[t + 1].",
                        "in transformers labels are aligned with input_ids; the loss shifts them.")
        problems = _label_mistakes(got[None], roles[None])
        if problems:
            words = [w for w in _MISTAKE_HINTS if any(p.endswith(f" {w} token(s)") for p in problems)]
            extra = (" Count the positions start + prompt_length up to and including start + length - 1 "
                     "(Python: range(start + prompt_length, start + length)): the last one is the EOS, counted.")
            return fail(f"{where} " + "; ".join(problems) + ".",
                        " ".join(_MISTAKE_HINTS[w] for w in words) + extra)
        bad = int(((got != want) & (want != IGNORE_INDEX)).nonzero()[0])
        return fail(f"{where} the counted positions are right, but at token {bad} your label is "
                    f"{int(got[bad])}, expected the token id {int(want[bad])}.",
                    "a counted label is the token id itself (input_ids), not a role or a 1.")
    return ok("right: from lengths and prompt lengths alone you placed each example, ignored its "
              "prompt (its <bos>, the boundary, included) and the padding, and kept its response "
              "and EOS.")


# Micro-batches of per-token losses the loss check tries (one 1-D tensor per micro-batch).
def _losses(sizes, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.rand(n, generator=gen, dtype=torch.float64) * 4 for n in sizes]


LOSS_CASES: tuple[tuple[int, ...], ...] = ((3, 12, 1, 7), (5, 5), (6, 0, 9))


@check("per-token loss over micro-batches")
def check_per_token_loss(fn) -> Feedback:
    """``fn(micro_batches: list of 1-D tensors of token losses) -> scalar``: sum / total tokens."""
    for seed, sizes in enumerate(LOSS_CASES):
        parts = _losses(sizes, seed)
        total = sum(float(p.sum()) for p in parts)
        n = sum(sizes)
        want = total / n
        got = fn([p.clone() for p in parts])
        where = f"for micro-batches of {list(sizes)} response tokens"
        try:
            value = float(got)
        except (TypeError, ValueError):
            return fail(f"{where} you returned a {type(got).__name__}, not a number.",
                        "return a float or a 0-d tensor.")
        if math.isclose(value, want, rel_tol=1e-6, abs_tol=5e-5):  # slips: >= 0.04 away
            continue
        means = [float(p.mean()) for p in parts if p.numel()]
        if math.isnan(value) and 0 in sizes:
            return fail(f"{where} you returned nan: a micro-batch with no response token has a "
                        "mean of 0/0.",
                        "don't average per micro-batch: add up the token losses and the token "
                        "counts over all micro-batches, then divide once.")
        if math.isclose(value, sum(means) / len(sizes), rel_tol=1e-6) or math.isclose(
            value, sum(means) / len(means), rel_tol=1e-6
        ):
            return fail(f"{where} you returned the mean of the per-micro-batch means ({value:.4f}); "
                        f"the per-token loss is {want:.4f}.",
                        "a mean of means gives each token of a small micro-batch more weight: "
                        "divide the sum of all token losses by the total number of tokens.")
        if math.isclose(value, total, rel_tol=1e-6):
            return fail(f"{where} you returned the sum of the token losses ({value:.4f}), not "
                        "normalised.",
                        "divide by the total number of response tokens in the step.")
        if math.isclose(value, total / len(sizes), rel_tol=1e-6):
            return fail(f"{where} you divided the summed loss by the number of micro-batches.",
                        "divide by the number of response tokens (what Trainer calls "
                        "num_items_in_batch), not by the number of micro-batches.")
        return fail(f"{where} you returned {value:.4f}, expected {want:.4f}.",
                    "sum every token loss of every micro-batch, divide by the total token count.")
    return ok("right: every response token weighs the same, whatever micro-batch it is in "
              "(the fix transformers' Trainer applies through num_items_in_batch).")


# ----------------------------------------------------------------------------- spot the right row


@dataclass(frozen=True)
class LabelCandidates:
    """One packed row (T,) and four candidate label rows for it (letter -> (T,) labels)."""

    input_ids: torch.Tensor
    roles: torch.Tensor
    rows: dict[str, torch.Tensor]


_ROW_VERDICTS = {
    "A": "row A drops the EOS labels: the model would never learn to stop.",
    "B": "row B counts the boundary token (the second example's <bos>): the first example's "
    "EOS is trained to predict the <bos> that follows it in the pack (with a tokenizer that adds no "
    "BOS, such as Qwen's, it would be the next example's first prompt token).",
    "C": None,  # the right one
    "D": "row D is shifted by one: labels[t] holds input_ids[t + 1]. transformers shifts the "
    "labels itself, so this trains every token to predict two ahead.",
}
CORRECT_LETTER = "C"


def label_candidates() -> LabelCandidates:
    """Two examples packed in one row of 34 tokens, and four candidate completion-only label rows."""
    batch = PackedBatch.from_examples(make_examples(2, seed=2), capacity=34, setup="correct")
    ids, roles = batch.input_ids[0], batch.roles[0]  # (T,)
    right = make_labels(ids[None], roles[None], "completion")[0]  # (T,)
    no_eos = torch.where(roles == Role.EOS, IGNORE_INDEX, right)
    with_boundary = torch.where(roles == Role.BOUNDARY, ids, right)
    shifted = torch.full_like(right, IGNORE_INDEX)
    shifted[:-1] = torch.where(right[1:] != IGNORE_INDEX, ids[1:], IGNORE_INDEX)
    rows = {"A": no_eos, "B": with_boundary, "C": right, "D": shifted}
    return LabelCandidates(ids, roles, rows)


_ROLE_CODES = {Role.PAD: ".", Role.FIRST: "f", Role.BOUNDARY: "b", Role.PROMPT: "p",
               Role.RESPONSE: "r", Role.EOS: "e"}


def _glyph(token_id: int) -> str:
    tok = build_tokenizer().convert_ids_to_tokens(int(token_id))
    return {"<bos>": "^", "<eos>": "$", "<pad>": "_", " ": "~"}.get(tok, tok)


def show_candidates() -> None:
    """Print the row of :func:`label_candidates` and its four label rows, one column per token.

    ``^`` is <bos>, ``$`` <eos>, ``_`` padding, ``~`` a space; in a label row a character is a
    counted label (its token) and ``-`` is -100. Roles: f first, p prompt, r response, e EOS,
    b boundary, . padding.
    """
    cand = label_candidates()
    print("token  " + " ".join(_glyph(t) for t in cand.input_ids.tolist()))
    print("role   " + " ".join(_ROLE_CODES[Role(int(r))] for r in cand.roles.tolist()))
    for letter, labels in cand.rows.items():
        cells = ["-" if lab == IGNORE_INDEX else _glyph(lab) for lab in labels.tolist()]
        print(f"{letter}      " + " ".join(cells))


@check("spot the right label row")
def check_correct_row(answer) -> Feedback:
    """``answer``: the letter ("A".."D") of the one correct label row of :func:`label_candidates`."""
    letter = str(answer).strip().upper()
    if letter not in _ROW_VERDICTS:
        return fail(f"answer {answer!r} is not one of the letters {sorted(_ROW_VERDICTS)}.",
                    'set answer = "A" (or B, C, D).')
    cand = label_candidates()
    want = make_labels(cand.input_ids[None], cand.roles[None], "completion")[0]
    if torch.equal(cand.rows[letter], want):  # the oracle agrees with the verdict table
        return ok(f"row {letter} is right: response tokens and EOS counted, prompt, boundary and "
                  "padding ignored, labels aligned with the tokens.")
    return fail(_ROW_VERDICTS[letter] or f"row {letter} is not the right one.",
                "compare each row with the role line: only r and e positions should show a token, "
                "and each shown token should be the one directly above it.")


# ----------------------------------------------------------------------------- the template trap

TEMPLATE = "="  # the response template of the default tasks: every prompt ends with it


@functools.cache
def lesson_bpe() -> Tokenizer:
    """The BPE tokenizer of the lesson's trap section, trained locally with the same recipe (no download).

    Training is deterministic, so this is the lesson's ``bpe`` token for token.
    """
    corpus = [ex.prompt_text + ex.response_text for ex in make_examples(600, seed=11)]
    bpe = Tokenizer(models.BPE())  # no pre-tokenizer: merges may cross any character
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=200, show_progress=False))
    return bpe


@dataclass(frozen=True)
class BoundaryCase:
    """One example tokenized alone (``prompt_ids``) and joined (``full_ids``), and where its response starts."""

    task: str
    prompt: str
    response: str
    prompt_ids: tuple[int, ...]
    full_ids: tuple[int, ...]
    start: int  # first token of full_ids whose characters reach past the prompt (from the offsets)

    @property
    def merged(self) -> bool:
        """A token of ``full_ids`` straddles the prompt/response boundary."""
        return self.full_ids[: len(self.prompt_ids)] != self.prompt_ids


@functools.cache
def boundary_cases() -> tuple[BoundaryCase, ...]:
    """For each task, the first held-out example (``make_examples(300, seed=12)``, the lesson's) that
    tokenizes cleanly at the boundary, then for each task the first one where a merge crosses it."""
    bpe = lesson_bpe()
    clean, merged = {}, {}
    for ex in make_examples(300, seed=12):
        joint = bpe.encode(ex.prompt_text + ex.response_text)
        start = next(i for i, (_, end) in enumerate(joint.offsets) if end > len(ex.prompt_text))
        case = BoundaryCase(ex.task, ex.prompt_text, ex.response_text,
                            tuple(bpe.encode(ex.prompt_text).ids), tuple(joint.ids), start)
        (merged if case.merged else clean).setdefault(ex.task, case)
    order = ("add", "sort", "reverse", "kv")  # add first: the lesson's example is an add
    return tuple(c[t] for c in (clean, merged) for t in order if t in c)


@check("where the response starts")
def check_response_start(fn) -> Feedback:
    """``fn(full_ids list[int], prompt_ids list[int]) -> int``: the first token holding a response character."""
    bpe = lesson_bpe()
    template = bpe.encode(TEMPLATE).ids
    hint = ("the prompt tokenized alone tells you where the prompt ends: compare full_ids with "
            "prompt_ids position by position; the response starts at the first position where "
            "they differ (len(prompt_ids) when the prompt is a whole prefix).")
    for case in boundary_cases():
        full, prompt, start = list(case.full_ids), list(case.prompt_ids), case.start
        toks = [bpe.id_to_token(i) for i in full]
        where = (f"for prompt {case.prompt!r} + response {case.response!r} (joint tokens {toks}, "
                 f"prompt alone {[bpe.id_to_token(i) for i in prompt]})")
        why = (f" The template {TEMPLATE!r} tokenized alone is {template}, but here it merged with "
               f"the answer's first character(s) into {toks[start]!r} (id {full[start]}): its ids never "
               "occur in the joint ids, so a search for them finds nothing (TRL's old collator "
               "warned 'Could not find response key', https://github.com/huggingface/trl/issues/588)."
               if case.merged and template[0] not in full and toks[start].startswith(TEMPLATE) else "")
        try:
            got = fn(list(full), list(prompt))
        except NotImplementedError:
            raise
        except Exception as err:
            return fail(f"{where} your function raised {type(err).__name__}: {err}.{why}", hint)
        try:
            got = operator.index(got)
        except TypeError:
            return fail(f"{where} you returned a {type(got).__name__}, not an int.",
                        "return the index as an int (for a tensor, int(...)).")
        if got == start:
            continue
        if case.merged and got == len(prompt):
            return fail(f"{where} you returned len(prompt_ids) = {got}, which assumes the prompt's "
                        f"tokens are a prefix of the joint tokens; here only the first {start} agree: "
                        f"token {start} {toks[start]!r} already holds the start of the answer, so "
                        "masking the labels before your index never trains the model on it.", hint)
        if not 0 <= got < len(full):
            return fail(f"{where} you returned {got}, not an index of the {len(full)} joint tokens: "
                        f"no response token would be counted.{why}", hint)
        if got < start:
            what = ("the template token itself: it ends the prompt, the response starts after it"
                    if toks[got:start] == [TEMPLATE] else f"prompt tokens {toks[got:start]} counted")
            return fail(f"{where} you returned {got}, expected {start}: {what}.{why}", hint)
        return fail(f"{where} you returned {got}, expected {start}: response tokens "
                    f"{toks[start:got]} masked, never trained.{why}", hint)
    return ok("right on every task, merged boundary or not: the response starts where the joint "
              "tokens stop agreeing with the prompt's own tokens (TRL's SFTTrainer does the same "
              "with trl.data_utils.common_prefix_length, and warns). A straddling token like '=8' is "
              "still trained after a context the model never sees at inference (the prompt alone "
              "ends with '='): fix 1, concatenating separately tokenized ids, avoids the question. "
              "Comparing ids is still a heuristic: a merge that reaches back past the boundary makes them "
              "differ one token early; the next cell shows it, and the offsets rule that survives it.")
