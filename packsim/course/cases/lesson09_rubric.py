"""Reading a written interview answer against a rubric, for a self-check with no verdict; and
:data:`Q1_RUBRIC`, interview question 1's (used by ``lesson09_interview_drills.assess_q1_answer``).

A :class:`Rubric` holds the ingredients a model answer has and the red flags of a junior one.
:func:`read` cuts the answer into sentences (:func:`sentences`) and reports, for each
:class:`Ingredient`, the phrases its regular expressions matched and the sentence each sits in
(:class:`Found`), marking a phrase a negation governs ("tiles are *not* skipped"); for each
:class:`RedFlag`, the sentences that state its false claim; and the sentences that are a bare
list of terms. A red flag counts only where its claim is asserted: not when a negation or a
contrast denies it, before it in its clause ("no mask is read from HBM", "unlike a dense mask
loaded from HBM"), inside it ("position ids never isolate") or right after it ("position ids
separate nothing"); not when the sentence is about another path ("a naive kernel does N^2 work");
and not when the flag's ``unless`` follows it in its clause ("position ids are used to separate
the examples *into cu_seqlens*").

The reading is of words, not meaning: an answer can hold every ingredient's words and still be
wrong ("tiles, online softmax, cu_seqlens: none of that matters"), and a right sentence can be
worded past every pattern. So a :class:`Reading` has no verdict: the check lays each ingredient
of the model answer beside what the learner wrote and the learner judges (issue 40: the earlier
check said "correct" for seven wrong answers out of ten).

No check lives here, so no solution mirrors this module.

Lessons: none directly (through its lesson's checks).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["Ingredient", "RedFlag", "Rubric", "Found", "Reading", "SelfCheck", "read", "sentences", "Q1_RUBRIC"]

# a word that denies the claim next to it
NEGATION = re.compile(
    r"\b(not|never|no|nor|none|nothing|neither|without|cannot|instead of|rather than|unlike|nowhere)\b|n't\b", re.I
)
# before a claim in its clause: a contrast that sets the claim aside ("far less than N^2 work")
CONTRAST = re.compile(
    r"\b(than|versus|vs|compared|against|avoid\w*|sav(e|es|ed|ing)|eliminat\w*|reduc\w*|cut(s|ting)?|"
    r"replac\w*|whereas)\b", re.I
)
# before a claim in its sentence: the claim is about another path, not the varlen kernel
ELSEWHERE = re.compile(
    r"\b(naive|standard|vanilla|regular|plain|ordinary|eager|sdpa|would|baseline|textbook|buggy)\b|the bug\b|"
    r"\bdense[- ]mask (path|attention|kernel|version)|causal (kernel|mask|attention) over the (whole )?(pack|row)", re.I
)
# right after a claim (two words at most, before any conjunction): "separate nothing", "scores never exist"
_AFTER = re.compile(r"^\W*(?:(?!and\b|but\b|so\b|because\b|which\b|that\b|while\b)\w+\W+)?"
                    r"(not|never|nothing|none|no one|nowhere|isn't|aren't|doesn't|don't|is not|are not)\b", re.I)
_CLAUSE_END = re.compile(r"[,;:()]")
_SENTENCE_END = re.compile(r"(?<=[.!?;:])[*_\"'”’)\]]*\s+|\n\s*(?:[-*]|\d+[.)])\s+|\n\s*\n")
# a phrase that is itself a denial ("never materialised"): a negation before it agrees with it
_NEGATIVE_SENSE = re.compile(r"materiali[sz]|never|\bnot\b|n't|\bno\b|without|instead|avoid|exit", re.I)


@dataclass(frozen=True)
class Ingredient:
    """``name``, what the model answer says (``what``) and ``needs``: regexes that must all match
    (case-insensitive) for its words to be there."""

    name: str
    what: str
    needs: tuple[str, ...]


@dataclass(frozen=True)
class RedFlag:
    """A false claim: ``pattern`` (a regex, case-insensitive), ``why`` it is false, and ``unless``:
    a regex that, found after the claim in its clause, makes it a right statement."""

    claim: str
    pattern: str
    why: str
    unless: str = ""


@dataclass(frozen=True)
class Rubric:
    required: tuple[Ingredient, ...]
    flags: tuple[RedFlag, ...]
    optional: tuple[Ingredient, ...] = ()


@dataclass(frozen=True)
class Found:
    """One phrase an ingredient's regex matched, the sentence it is in, and whether a negation
    governs it there (``denied``: the sentence may say the opposite of the ingredient)."""

    phrase: str
    sentence: str
    denied: bool = False


@dataclass
class Reading:
    """What :func:`read` found, with no verdict: ``found`` / ``extras`` map an ingredient's name to
    its :class:`Found` phrases; ``missing`` / ``extras_missing`` list the ingredients whose words are
    absent; ``flags`` the red flags, each with its sentence; ``term_lists`` the sentences that are
    a list of terms, with how many ingredient phrases and words each holds."""

    found: dict[str, list[Found]] = field(default_factory=dict)
    missing: list[Ingredient] = field(default_factory=list)
    extras: dict[str, list[Found]] = field(default_factory=dict)
    extras_missing: list[Ingredient] = field(default_factory=list)
    flags: list[tuple[RedFlag, str]] = field(default_factory=list)
    term_lists: list[tuple[str, int, int]] = field(default_factory=list)


def sentences(text: str) -> list[str]:
    """``text`` cut into sentences (also at ``;``, ``:``, list bullets and blank lines), each on one line."""
    return [" ".join(s.split()) for s in _SENTENCE_END.split(text) if s and s.strip()]


def _negated(sentence: str, match: re.Match) -> bool:
    """A negation earlier in the clause of ``match`` or inside it ("tiles are *not* skipped")."""
    before = _CLAUSE_END.split(sentence[: match.start()])[-1]
    return bool(NEGATION.search(before) or NEGATION.search(match.group(0)))


def _denied(sentence: str, match: re.Match) -> bool:
    """True when the claim ``match`` found in ``sentence`` is not asserted: negated (:func:`_negated`),
    set aside by a contrast earlier in its clause, denied right after it, or about another path."""
    before = _CLAUSE_END.split(sentence[: match.start()])[-1]
    after = _CLAUSE_END.split(sentence[match.end():])[0]
    return bool(_negated(sentence, match) or CONTRAST.search(before) or _AFTER.search(after)
                or ELSEWHERE.search(sentence[: match.start()]))


def _asserted(flag: RedFlag, sentence: str) -> bool:
    for m in re.finditer(flag.pattern, sentence, re.I):
        rest = _CLAUSE_END.split(sentence[m.end():])[0]
        if not _denied(sentence, m) and not (flag.unless and re.search(flag.unless, rest, re.I)):
            return True
    return False


def _found(ingredient: Ingredient, parts: list[str]) -> list[Found] | None:
    """Where each of the ingredient's regexes first matched, or None when one matches nowhere."""
    out = []
    for pattern in ingredient.needs:
        hit = next(((s, m) for s in parts for m in [re.search(pattern, s, re.I)] if m), None)
        if hit is None:
            return None
        s, m = hit
        negative = _NEGATIVE_SENSE.search(m.group(0))
        out.append(Found(m.group(0).strip(), s, bool(not negative and _negated(s, m))))
    return out


def read(answer: str, rubric: Rubric) -> Reading:
    """Read ``answer`` against ``rubric``: each ingredient's words and where, red flags, term lists."""
    parts = sentences(answer)
    reading = Reading()
    for ingredients, found, missing in ((rubric.required, reading.found, reading.missing),
                                        (rubric.optional, reading.extras, reading.extras_missing)):
        for ing in ingredients:
            hits = _found(ing, parts)
            if hits is None:
                missing.append(ing)
            else:
                found[ing.name] = hits
    for s in parts:
        reading.flags += [(flag, s) for flag in rubric.flags if _asserted(flag, s)]
        terms = sum(1 for ing in rubric.required for p in ing.needs if re.search(p, s, re.I))
        words = len(re.findall(r"\w+", s))
        if terms >= 3 and words <= 2 * terms:  # "tiles, online softmax, cu_seqlens, skip": names, no claims
            reading.term_lists.append((s, terms, words))
    return reading


# ----------------------------------------------------------------------------- question 1

_TILES = r"\btil(e|es|ed|ing)\b|\bblocks?\b|\bblockwise\b|\btile-?wise\b|\bchunks?\b"
_NO_MATRIX = (
    r"online[- ]?softmax|(incremental|streaming|running|rescaled) softmax|softmax.{0,20}\b(incrementally|"
    r"on the fly)|running (max|maximum|sum|softmax|normali[sz]er|statistics)|row[- ]?max|rescal|"
    r"log[- ]?sum[- ]?exp|\blse\b|materiali[sz]|on[- ]chip|\bsram\b|shared memory|registers|"
    r"never (stored|written|built|formed|exists?|held)"
)
_SKIP_VERB = r"(comput|form|visit|load|launch|touch|evaluat|calculat|process)\w*"
_N2 = r"n\s*(\^ ?2|²|\*\* ?2|[- ]squared)"
_NXN = r"n\s*[x×*]\s*n\b"
_MASK = r"((dense|boolean|bool|full|block[- ]diagonal|n ?[x×] ?n|attention|explicit|additive)\s+)*mask\b"
Q1_RUBRIC = Rubric(
    required=(
        Ingredient(
            "how",
            "tiles with an online softmax: the N x N scores (and so any mask) never exist in memory",
            (_TILES, _NO_MATRIX),
        ),
        Ingredient(
            "with what",
            "cu_seqlens, the int32 offsets [0, L0, L0+L1, ...] (and max_seqlen): each thread block "
            "reads its example's start and length from them",
            (r"cu_?seq_?lens|cumulative (sequence |example )?lengths|\boffsets?\b|prefix[- ]sums?|"
             r"\bcum ?sums?\b|cumulative sums?|running (sum|total)s? of (the )?(example |sequence )?lengths|"
             r"\bcu\s*=|\[\s*0\s*,\s*l_?0",),
        ),
        Ingredient(
            "what is skipped",
            "tiles across an example boundary and above the diagonal are never computed; only "
            "diagonal tiles mask per element",
            (
                r"\bskip|\bexit\w* (early|immediately|at once)|never (cross|mix|span|straddl)\w*|"
                rf"(never|not|n't|no) (be |get |even )?{_SKIP_VERB}|never launched|(does|do) no work|"
                r"only (the |its |their )?(own|diagonal|within)|only (visits|loops|walks|reads|computes|touches|sees)|"
                r"(same|own|single) (example|sequence|document)|within (its|each|one|the same|a) "
                r"(example|sequence|document)",
            ),
        ),
        Ingredient(
            "what it costs",
            "work grows with the sum of squared example lengths (sum L_i^2), not N^2; memory with N",
            (
                r"sum of (the )?(squared|squares)|squared (example |sequence |document )?lengths|[Σ∑]|"
                r"squares? of (the |each |every )?(example |sequence |document )?lengths?|lengths? squared|"
                r"\bsum\b.{0,24}(\^ ?2|²|\*\* ?2)|\bl_?[a-z0-9]? ?(\^ ?2|²|\*\* ?2)|\bl_?\d+ squared|"
                r"\bsum\b.{0,30}\bsquared?\b|"
                r"quadratic\w*.{0,30}\b(each|every|per|its own|individual) (example|sequence|document)",
            ),
        ),
    ),
    flags=(
        RedFlag(
            "a mask built on chip",
            r"(((dense|boolean|bool|block[- ]diagonal|full|whole|entire|n ?[x×] ?n)\s+(\w+\s+)?|"
            r"(build|construct|creat|stor|keep|hold)\w*\s+(the |an? |its )?)mask\b)"
            r".{0,60}\b(on[- ]chip|sram|shared memory|registers)",
            "no mask is built at all, not even on chip: the boundaries come from cu_seqlens, and a "
            "diagonal tile masks with an index test computed in registers",
        ),
        RedFlag(
            "a mask loaded from HBM",
            rf"(load|read|fetch|stream|bring|cop(y|ie)|mov)\w*\s+(in\s+)?(the |an? |its )?{_MASK}.{{0,50}}?"
            r"\b(hbm|global memory|gpu memory|device memory|dram|from memory)|"
            r"mask\w*\s+(is |are |gets )?(\w+\s+)?(loaded|read|fetched|streamed|copied)\s+(in\s+)?(from|out of)\s+"
            r"(hbm|global|gpu|device|dram|memory)|"
            r"mask\b.{0,30}\b(stored|kept|held|lives?|sits?|resides?) in (hbm|global memory)",
            "no mask exists anywhere, in HBM or on chip: the kernel reads S + 1 offsets (cu_seqlens) and "
            "tests indices in registers; an N x N mask in HBM would cost N^2 memory and bandwidth",
        ),
        RedFlag(
            "cross-example scores zeroed",
            r"multipl\w*.{0,40}\bby (0|zero)\b|zero(e?s|ing|ed)? out|"
            r"(scores|logits|weights).{0,30}\b(set|masked|forced) to (0|zero)\b",
            "multiplying by zero would still pay for every tile (and a score of 0 is not masked: "
            "exp(0) = 1); those tiles are never computed",
        ),
        RedFlag(
            "position ids isolate",
            r"(position[_ ]?ids?|(rope|rotary|restart\w*|reset\w*) (position\w*|ids?)|positions? (that )?"
            r"(restart|reset)\w*)\b.{0,50}?\b(isolat|separat|apart)\w*",
            "position ids do not restrict which keys a query reads; in the kernel the isolation is "
            "the per-example tiles (in transformers, restarting position ids are how the pack is "
            "detected, then a mask or cu_seqlens isolates)",
            unless=r"\b(into|to (derive|build|compute|find|get|make|detect))\b.{0,40}"
                   r"(cu_?seq_?lens|offsets?|boundar|segments|mask)",
        ),
        RedFlag(
            "examples padded to max_seqlen",
            r"\bpad\w*.{0,40}\b(to|up to) (the )?max_?seq_?len|"
            r"(examples|sequences)\s*[x×*]\s*max_?seq_?len\b.{0,20}(work|pairs|cost|flops)",
            "there is no padding: an example of length L costs about L^2/2 pairs; the grid is sized "
            "by max_seqlen, but blocks past a short example exit at once",
        ),
        RedFlag(
            "N^2 work or memory",
            rf"\b(full|whole|entire|dense|complete|all)\s+(the\s+)?({_NXN}|{_N2})|"
            rf"\b{_N2}\s+(work|flops|compute|cost|time|memory|operations|pairs|scores|score pairs|attention)\b|"
            rf"\b(work|flops|compute|cost|memory|time|complexity)\s+(\w+\s+){{0,3}}?(o\(\s*)?({_N2}|"
            r"quadratic in (the )?(pack|n\b|total|whole|row))|"
            rf"\bo\(\s*{_N2}\s*\)\s*(work|flops|compute|cost|time|memory|operations)\b|"
            r"\b(comput|evaluat|calculat|process)\w*\s+(\w+\s+){0,2}?(every|all)\s+(the\s+)?(tiles?|blocks?|pairs?|scores?)\b",
            "the varlen kernel's work is the sum of squared example lengths (sum L_i^2 / 2 pairs, causal) "
            "and its memory O(N): cross-example tiles are never computed, and blocks past a short "
            "example exit at once",
            unless=r"\b(of|in|within|inside) (its|the|each|that|a|one) (own )?(query )?(tile|block|example|sequence|document)\b",
        ),
        RedFlag(
            "a materialised backward",
            r"(stor|sav|keep|cach|materiali[sz]|writ)\w*\s+(\w+\s+){0,3}?(n\s*[x×]\s*n|attention (matrix|"
            r"probabilities|weights)|probabilit\w+|score matrix|softmax (matrix|output|probabilities))\b.{0,50}"
            r"\bbackward|backward\b.{0,60}?\b(stor|sav|keep|cach|materiali[sz]|read|load)\w*\s+(\w+\s+){0,3}?"
            r"(n\s*[x×]\s*n|attention (matrix|probabilities|weights)|probabilit\w+|score matrix)",
            "the backward stores nothing N x N: it recomputes each score tile from Q, K and the saved "
            "log-sum-exp (FlashAttention-2, section 3.1.2) and skips the same tiles",
        ),
    ),
    optional=(
        Ingredient("the backward", "the backward is tiled too and skips the same tiles",
                   (r"backward|gradients?|\bd[qkv]\b",)),
        Ingredient("max_seqlen and the grid", "max_seqlen sizes the launch grid",
                   (r"max_?seq_?len",)),
        Ingredient("load imbalance", "one long example among short ones sets the finish time",
                   (r"imbalanc|straggl|long example|longest example|finish time",)),
        Ingredient("GQA", "K/V with fewer heads than Q: fewer bytes, the same score count",
                   (r"\bgqa\b|grouped[- ]query|fewer (k/?v )?heads",)),
    ),
)


# ----------------------------------------------------------------------------- the self-check


def _where(hits: list[Found]) -> str:
    """'tiles' + 'online softmax' in "the sentence" (one quote per sentence), negations marked."""
    by_sentence: dict[str, list[Found]] = {}
    for f in hits:
        by_sentence.setdefault(f.sentence, []).append(f)
    parts = []
    for sentence, fs in by_sentence.items():
        said = " + ".join(f"'{f.phrase}'" for f in fs)
        denied = [f.phrase for f in fs if f.denied]
        note = f" (a negation governs '{denied[0]}' there: does the sentence say the opposite?)" if denied else ""
        parts.append(f'{said} in "{sentence}"{note}')
    return "; ".join(parts)


@dataclass(frozen=True)
class SelfCheck:
    """A written answer laid beside a rubric's model answer, with no verdict: ``rows`` (part, the
    model answer's words, where the answer has them or "no words of it found"), then ``notes``
    (red flags, term lists, depth). Shows as a box in a notebook and as text elsewhere; it has no
    ``passed``: the learner judges."""

    exercise: str
    rows: tuple[tuple[str, str, str], ...]
    notes: tuple[str, ...]
    status: str = "self-check"

    INTRO = ("No verdict: this reader matches words, not meaning, so it cannot tell a right claim from "
             "a wrong one in the same words. Set each part of your answer beside the model answer's and "
             "judge it yourself.")

    @classmethod
    def of(cls, exercise: str, reading: Reading, rubric: Rubric) -> SelfCheck:
        rows = tuple((i.name, i.what, _where(reading.found[i.name]) if i.name in reading.found
                      else "no words of it found") for i in rubric.required)
        notes = [f'Reread "{s}": it reads as the claim *{flag.claim}*, which is false: {flag.why}. If your '
                 "sentence says the opposite, say it more plainly." for flag, s in reading.flags]
        notes += [f'"{s}" names {terms} terms in {words} words: a list, not an explanation; an interviewer '
                  "asks what each does and how they connect." for s, terms, words in reading.term_lists]
        if reading.extras:
            notes.append("Depth you touched: " + "; ".join(f"{name} ({_where(f)})" for name, f in reading.extras.items())
                         + ".")
        if reading.extras_missing:
            notes.append("An interviewer may ask next about " + "; ".join(f"{i.name}: {i.what}"
                                                                           for i in reading.extras_missing) + ".")
        return cls(exercise, rows, tuple(notes))

    def __str__(self) -> str:
        from packsim.course.exercises import plain_text

        lines = [f"[{self.exercise}] {self.status}: {self.INTRO}"]
        lines += [f"  {part}: the model answer: {model}. Yours: {yours}." for part, model, yours in self.rows]
        lines += [f"  {plain_text(n)}" for n in self.notes]
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        from packsim.course.exercises import marks_to_html
        from packsim.viz.feedback import feedback_html

        cell = "<td style='text-align:left;vertical-align:top;padding:2px 6px'>"
        rows = "".join(f"<tr>{cell}<b>{marks_to_html(p)}</b></td>{cell}{marks_to_html(m)}</td>{cell}{marks_to_html(y)}</td></tr>"
                       for p, m, y in self.rows)
        table = ("<table><tr><th style='text-align:left'>part</th><th style='text-align:left'>the model answer</th>"
                 f"<th style='text-align:left'>in your answer</th></tr>{rows}</table>")
        notes = "".join(f"<li>{marks_to_html(n)}</li>" for n in self.notes)
        body = marks_to_html(self.INTRO) + table + (f"<ul>{notes}</ul>" if notes else "")
        return feedback_html(self.status, f"<b>{marks_to_html(self.exercise)}</b>: ", body, "")
