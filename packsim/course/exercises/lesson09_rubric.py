"""Reading a written interview answer against a rubric, and :data:`Q1_RUBRIC`, interview question
1's (the check: ``lesson09_interview_drills.check_q1_answer``).

A :class:`Rubric` holds the ingredients an answer must contain and the red flags it must not.
An :class:`Ingredient` is found when each of its regular expressions matches somewhere in the
answer (e.g. "tiles" *and* "online softmax"); a :class:`RedFlag` counts unless a negation denies
it, inside the claim or earlier in its clause ("it does not build the mask on chip" is right;
"it builds the mask on chip, not in HBM" is not: that "not" denies something else).
Ingredients ignore negation (an answer that denies them all would pass).
Optional ingredients are the depth an interviewer asks for next: named when present or absent,
never required. The reading is of words, not meaning, so :func:`read` keeps what it matched and
the check quotes it back: a learner sees why a part was or was not recognised.

No check lives here, so no solution mirrors this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["Ingredient", "RedFlag", "Rubric", "Reading", "read", "sentences", "Q1_RUBRIC"]

# "not", "never", "no", "without" ...: a word that denies the claim after it in its clause.
NEGATION = re.compile(
    r"\b(not|never|no|nor|none|nothing|neither|without|cannot|instead|rather|unlike)\b|n't\b", re.I
)
_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+|\n\s*[-*]\s+|\n\s*\n")


@dataclass(frozen=True)
class Ingredient:
    """``name``, what it says (``what``, quoted when it is missing) and ``needs``: regexes that
    must all match (case-insensitive)."""

    name: str
    what: str
    needs: tuple[str, ...]


@dataclass(frozen=True)
class RedFlag:
    """A false claim: ``pattern`` (a regex, case-insensitive) and ``why`` it is false."""

    claim: str
    pattern: str
    why: str


@dataclass(frozen=True)
class Rubric:
    required: tuple[Ingredient, ...]
    flags: tuple[RedFlag, ...]
    optional: tuple[Ingredient, ...] = ()


@dataclass
class Reading:
    """What :func:`read` found: ``found`` / ``extras`` map an ingredient's name to the phrases
    matched; ``missing`` and ``extras_missing`` list ingredients; ``flags`` the red flags raised,
    each with its sentence."""

    found: dict[str, list[str]] = field(default_factory=dict)
    missing: list[Ingredient] = field(default_factory=list)
    extras: dict[str, list[str]] = field(default_factory=dict)
    extras_missing: list[Ingredient] = field(default_factory=list)
    flags: list[tuple[RedFlag, str]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.missing and not self.flags


def sentences(text: str) -> list[str]:
    """``text`` cut into sentences (also at ``;``, ``:``, list bullets and blank lines)."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s and s.strip()]


def _matches(ingredient: Ingredient, text: str) -> list[str] | None:
    """The phrase each of the ingredient's regexes matched, or None when one does not match."""
    phrases = []
    for pattern in ingredient.needs:
        m = re.search(pattern, text, re.I)
        if m is None:
            return None
        phrases.append(m.group(0).strip())
    return phrases


def read(answer: str, rubric: Rubric) -> Reading:
    """Read ``answer`` against ``rubric``: which ingredients it has, which red flags it raises."""
    text = " ".join(answer.split())  # one line: a pattern may span the answer's line breaks
    reading = Reading()
    for ingredients, found, missing in ((rubric.required, reading.found, reading.missing),
                                        (rubric.optional, reading.extras, reading.extras_missing)):
        for ing in ingredients:
            phrases = _matches(ing, text)
            if phrases is None:
                missing.append(ing)
            else:
                found[ing.name] = phrases
    for sentence in sentences(answer):
        flat = " ".join(sentence.split())
        for flag in rubric.flags:
            if any(not _denied(flat, m) for m in re.finditer(flag.pattern, flat, re.I)):
                reading.flags.append((flag, flat))
    return reading


def _denied(sentence: str, match: re.Match) -> bool:
    """True when a negation denies the claim ``match`` found: inside it ("position ids never
    isolate"), or earlier in its clause ("it does not build ..."). A "no" after it ("..., so no
    extra memory") or in another clause denies nothing."""
    clause = re.split(r"[,;:()]", sentence[: match.start()])[-1]
    return bool(NEGATION.search(clause) or NEGATION.search(match.group(0)))


# ----------------------------------------------------------------------------- question 1

_TILES = r"\btil(e|es|ed|ing)\b|\bblocks?\b|\bchunks?\b"
_NO_MATRIX = (
    r"online[- ]?softmax|running (max|maximum|sum|softmax|normali[sz]er)|rescal|log[- ]?sum[- ]?exp|"
    r"\blse\b|materiali[sz]|on[- ]chip|\bsram\b|shared memory|registers|"
    r"never (stored|written|built|formed|exists?|held)"
)
_SKIP_VERB = r"(comput|form|visit|load|launch|touch|evaluat|calculat|process)\w*"
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
            (r"cu_?seq_?lens|cumulative (sequence |example )?lengths|\boffsets?\b",),
        ),
        Ingredient(
            "what is skipped",
            "tiles across an example boundary and above the diagonal are never computed; only "
            "diagonal tiles mask per element",
            (
                r"\bskip|\bexit\w* (early|immediately|at once)|never (cross|mix|span|straddl)\w*|"
                rf"(never|not|n't|no) (be |get |even )?{_SKIP_VERB}|"
                r"only (the |its |their )?(own|diagonal|within)|"
                r"(same|own|single) (example|sequence|document)|within (its|each|one|the same|a) "
                r"(example|sequence|document)",
            ),
        ),
        Ingredient(
            "what it costs",
            "work grows with the sum of squared example lengths (sum L_i^2), not N^2; memory with N",
            (
                r"sum of (the )?(squared|squares)|squared (example |sequence |document )?lengths|[Σ∑]|"
                r"\bsum\b.{0,24}(\^ ?2|²|\*\* ?2)|\bl_?i ?(\^ ?2|²|\*\* ?2)|"
                r"\bsum\b.{0,30}\bsquared?\b|"
                r"quadratic\w*.{0,30}\b(each|every|per|its own|individual) (example|sequence|document)",
            ),
        ),
    ),
    flags=(
        RedFlag(
            "a mask built on chip",
            r"((dense|boolean|bool|block[- ]diagonal|full|whole|entire|n ?[x×] ?n)\s+(\w+\s+)?|"
            r"(build|construct|creat|stor|keep|hold|load)\w*\s+(the |an? |its )?)mask\b"
            r".{0,60}\b(on[- ]chip|sram|shared memory|registers)",
            "no mask is built at all, not even on chip: the boundaries come from cu_seqlens, and a "
            "diagonal tile masks with an index test computed in registers",
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
            r"position[_ ]?ids?\b.{0,50}\b(isolat|separat)\w*",
            "position ids do not restrict which keys a query reads; in the kernel the isolation is "
            "the per-example tiles (in transformers, restarting position ids are how the pack is "
            "detected, then a mask or cu_seqlens isolates)",
        ),
        RedFlag(
            "examples padded to max_seqlen",
            r"\bpad\w*.{0,40}\bto max_?seq_?len|(examples|sequences)\s*[x×*]\s*max_?seq_?len\b.{0,20}"
            r"(work|pairs|cost|flops)",
            "there is no padding: an example of length L costs about L^2/2 pairs; the grid is sized "
            "by max_seqlen, but blocks past a short example exit at once",
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
