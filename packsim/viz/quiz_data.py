"""Spot-the-bug quizzes, the data: the YAML format, loading and validation, and grading.

Quizzes live in YAML files so instructors can add their own (packsim ships some in
``packsim/viz/quiz_files/*.yaml``): ``quizzes:``, a list of entries with a unique ``name``, a
``title``, ``kind`` (``code`` keeps lines and indentation, or ``prose``), ``passage``, ``bugs``
(each a ``word`` or ``words`` and ``why``) and optional ``intro`` / ``fine``; the format in full is
in :func:`load_quizzes`, which validates every field and names the file, quiz and field when one
is wrong. A word matches when it equals the passage word with surrounding punctuation removed.
Scoring (:func:`grade`): ``Score: n/m`` with ``m`` bugs and ``n`` = bugs found minus words marked
by mistake (never below 0). The widget that shows a quiz is :mod:`packsim.viz.quizzes`.

Lessons: 09.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from packsim.core.errors import PacksimError

__all__ = [
    "QuizData",
    "Bug",
    "Word",
    "Grade",
    "load_quizzes",
    "get_quiz",
    "grade",
    "split_words",
]

KINDS = ("code", "prose")
_PUNCT = ".,;:!?\"'"


@dataclass(frozen=True)
class Word:
    """One clickable word: its index in the passage, line, indentation (code) and text."""

    index: int
    line: int
    indent: int
    text: str


@dataclass(frozen=True)
class Bug:
    """A wrong spot: the passage word indices that count as finding it, and why it is wrong."""

    words: tuple[str, ...]
    positions: tuple[int, ...]
    why: str


@dataclass(frozen=True)
class QuizData:
    name: str
    title: str
    kind: str
    passage: str
    bugs: tuple[Bug, ...]
    intro: str = ""
    fine: dict[str, str] = field(default_factory=dict)
    source: str = ""

    @property
    def words(self) -> list[Word]:
        return split_words(self.passage)

    def why_fine(self, word: str) -> str:
        """Why a word that is not a bug is right (the quiz's ``fine`` entry, or a default)."""
        return self.fine.get(_norm(word), "nothing is wrong with this word.")


def split_words(passage: str) -> list[Word]:
    """The passage's words in reading order (split on whitespace, lines and indentation kept)."""
    out = []
    for ln, line in enumerate(passage.rstrip("\n").split("\n")):
        indent = len(line) - len(line.lstrip(" "))
        for text in line.split():
            out.append(Word(len(out), ln, indent, text))
    return out


def _norm(text: str) -> str:
    return text.strip(_PUNCT) or text


def _where(source: str, index: int, name) -> str:
    quiz = f"quiz {name!r}" if isinstance(name, str) and name else f"quiz #{index + 1}"
    return f"{source}: {quiz}"


def _text_field(entry: dict, key: str, where: str, required: bool = True) -> str:
    value = entry.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value.strip():
        raise PacksimError(
            f"{where}: field {key!r} must be a non-empty string, got {value!r}. "
            f"Add `{key}: ...` to the quiz entry."
        )
    return value


def _bug(raw, i: int, words: list[Word], where: str) -> Bug:
    at = f"{where}: bugs[{i}]"
    if not isinstance(raw, dict):
        raise PacksimError(
            f"{at} must be a mapping with 'word' (or 'words') and 'why', got {raw!r}."
        )
    if ("word" in raw) == ("words" in raw):
        raise PacksimError(
            f"{at} needs exactly one of 'word' (a string) or 'words' (a list of strings)."
        )
    targets = [raw["word"]] if "word" in raw else raw["words"]
    if (
        not isinstance(targets, list)
        or not targets
        or not all(isinstance(t, (str, int, float)) and str(t).strip() for t in targets)
    ):
        raise PacksimError(f"{at}: 'words' must be a non-empty list of words, got {targets!r}.")
    targets = [str(t) for t in targets]
    why = _text_field(raw, "why", at)
    occurrence = raw.get("occurrence")
    if occurrence is not None and (
        "words" in raw
        or isinstance(occurrence, bool)
        or not isinstance(occurrence, int)
        or occurrence < 1
    ):
        raise PacksimError(
            f"{at}: 'occurrence' must be a positive int (1 = first) and goes with a single 'word', "
            f"got {occurrence!r}."
        )
    positions = []
    for t in targets:
        hits = [w.index for w in words if _norm(w.text) == _norm(t)]
        if not hits:
            raise PacksimError(
                f"{at}: word {t!r} is not in the passage. Words are split on whitespace; copy the "
                "word exactly as it appears (surrounding punctuation .,;:!?\"' may be left out)."
            )
        if occurrence is not None:
            if occurrence > len(hits):
                raise PacksimError(
                    f"{at}: word {t!r} occurs {len(hits)} time(s) in the passage but occurrence is "
                    f"{occurrence}."
                )
            hits = [hits[occurrence - 1]]
        positions += hits
    return Bug(tuple(targets), tuple(positions), why.strip())


def _quiz(entry, index: int, source: str) -> QuizData:
    if not isinstance(entry, dict):
        raise PacksimError(
            f"{source}: quiz #{index + 1} must be a mapping of fields, got {entry!r}."
        )
    where = _where(source, index, entry.get("name"))
    unknown = set(entry) - {"name", "title", "kind", "intro", "passage", "bugs", "fine"}
    if unknown:
        raise PacksimError(f"{where}: unknown field(s) {sorted(unknown)}; check the spelling.")
    name = _text_field(entry, "name", where)
    title = _text_field(entry, "title", where)
    kind = entry.get("kind", "prose")
    if kind not in KINDS:
        raise PacksimError(f"{where}: field 'kind' must be one of {list(KINDS)}, got {kind!r}.")
    passage = _text_field(entry, "passage", where)
    words = split_words(passage)
    bugs = entry.get("bugs")
    if not isinstance(bugs, list) or not bugs:
        raise PacksimError(f"{where}: field 'bugs' must be a non-empty list of wrong words.")
    parsed = tuple(_bug(b, i, words, where) for i, b in enumerate(bugs))
    taken = [p for b in parsed for p in b.positions]
    if len(taken) != len(set(taken)):
        raise PacksimError(f"{where}: two bugs point at the same word; merge them into one bug.")
    fine = entry.get("fine") or {}
    if not isinstance(fine, dict) or not all(isinstance(v, str) for v in fine.values()):
        raise PacksimError(f"{where}: field 'fine' must map words to explanations (strings).")
    texts = {_norm(w.text) for w in words}
    for key in fine:
        if _norm(str(key)) not in texts:
            raise PacksimError(
                f"{where}: fine: word {key!r} is not in the passage; copy it exactly."
            )
    return QuizData(
        name=name,
        title=title,
        kind=kind,
        passage=passage,
        bugs=parsed,
        intro=_text_field(entry, "intro", where, required=False).strip(),
        fine={_norm(str(k)): v.strip() for k, v in fine.items()},
        source=source,
    )


def _read_file(path: Path) -> list[QuizData]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise PacksimError(f"{path}: not valid YAML ({err}).") from err
    if not isinstance(data, dict) or not isinstance(data.get("quizzes"), list):
        raise PacksimError(f"{path}: expected a mapping with a 'quizzes' list at the top level.")
    return [_quiz(entry, i, str(path)) for i, entry in enumerate(data["quizzes"])]


def _files(path) -> list[Path]:
    if path is None:
        root = resources.files("packsim.viz") / "quiz_files"
        return sorted(
            (Path(str(p)) for p in root.iterdir() if p.name.endswith(".yaml")), key=lambda p: p.name
        )
    path = Path(path)
    if path.is_dir():
        files = sorted([*path.glob("*.yaml"), *path.glob("*.yml")])
        if not files:
            raise PacksimError(f"no quiz files (*.yaml) in {path}.")
        return files
    if not path.exists():
        raise PacksimError(
            f"quiz file {path} does not exist: pass a YAML file or a folder of them."
        )
    return [path]


def load_quizzes(path=None) -> list[QuizData]:
    """All quizzes of a YAML file or folder (default: the ones packsim ships), validated.

    Raises :class:`PacksimError` naming the file, the quiz and the field on malformed input,
    and on two quizzes with the same name. The format::

        quizzes:
          - name: labels-clone            # unique, used to pick the quiz
            title: Labels for a packed row
            kind: code                    # code | prose (code keeps lines and indentation)
            intro: A teammate's collator. Mark every word that is wrong.   # optional
            passage: |
              labels = input_ids.clone()
            bugs:                         # at least one
              - word: input_ids.clone()   # a word of the passage (words are split on whitespace)
                occurrence: 1             # optional: which occurrence counts (default: every one)
                why: the loss then covers prompt, padding and boundary tokens ...
              - words: [alone, safe]      # or: several words, marking any one finds this bug
                why: ...
            fine:                         # optional: why tempting words are actually right
              labels: naming is not the problem ...
    """
    quizzes = [q for f in _files(path) for q in _read_file(f)]
    seen: dict[str, str] = {}
    for q in quizzes:
        if q.name in seen:
            raise PacksimError(
                f"quiz name {q.name!r} is used twice ({seen[q.name]} and {q.source}); "
                "names must be unique."
            )
        seen[q.name] = q.source
    if not quizzes:
        raise PacksimError(f"no quizzes found in {path}.")
    return quizzes


def get_quiz(name_or_index=None, path=None) -> tuple[list[QuizData], int]:
    """(all quizzes, index of the chosen one): by name, by 0-based index, or the first."""
    quizzes = load_quizzes(path)
    if name_or_index is None:
        return quizzes, 0
    if isinstance(name_or_index, int) and not isinstance(name_or_index, bool):
        if 0 <= name_or_index < len(quizzes):
            return quizzes, name_or_index
        raise PacksimError(
            f"quiz index {name_or_index} out of range: there are {len(quizzes)} quizzes."
        )
    names = [q.name for q in quizzes]
    if name_or_index in names:
        return quizzes, names.index(name_or_index)
    raise PacksimError(f"no quiz named {name_or_index!r}; available: {names}.")


@dataclass(frozen=True)
class Grade:
    """Result of a submission: bugs found / missed (indices into ``quiz.bugs``), wrong marks."""

    found: tuple[int, ...]
    missed: tuple[int, ...]
    wrong: tuple[int, ...]  # word indices marked that are not part of any bug
    total: int

    @property
    def score(self) -> int:
        return max(0, len(self.found) - len(self.wrong))


def grade(quiz: QuizData, marked) -> Grade:
    """Grade a set of marked word indices against ``quiz``'s bugs."""
    marked = set(marked)
    found = tuple(i for i, b in enumerate(quiz.bugs) if marked & set(b.positions))
    missed = tuple(i for i in range(len(quiz.bugs)) if i not in found)
    bug_positions = {p for b in quiz.bugs for p in b.positions}
    wrong = tuple(sorted(marked - bug_positions))
    return Grade(found, missed, wrong, len(quiz.bugs))
