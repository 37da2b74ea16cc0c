"""Spot-the-bug quizzes (notebook 08): click the wrong words of a passage, submit, get a score.

Quizzes live in YAML files so instructors can add their own; packsim ships some in
``packsim/quizzes/*.yaml``. A file holds ``quizzes:``, a list of entries::

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

A word matches when it equals the passage word with surrounding punctuation (``.,;:!?"'``)
removed. :func:`load_quizzes` checks every field and raises a :class:`PacksimError` naming the
file, the quiz and the field when something is wrong.

Scoring: ``Score: n/m`` with ``m`` bugs and ``n`` = bugs found minus words marked by mistake
(never below 0), so marking everything does not pay.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import ipywidgets as widgets
import plotly.graph_objects as go
import yaml
from plotly.subplots import make_subplots

from packsim.core.errors import PacksimError
from packsim.viz._common import PacksimWidget, close_tree, escape, style_html

__all__ = [
    "QuizData",
    "Bug",
    "Word",
    "Grade",
    "load_quizzes",
    "get_quiz",
    "grade",
    "QuizWidget",
    "quiz",
    "quiz_figure",
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
        root = resources.files("packsim.course") / "quizzes"
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
    and on two quizzes with the same name.
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


def result_html(quiz: QuizData, g: Grade) -> str:
    """The result panel: ``Score: n/m`` and one explanation per bug and per wrong mark."""
    words = quiz.words
    items = []
    for i, b in enumerate(quiz.bugs):
        ok = i in g.found
        mark = "&#10003; found" if ok else "&#10007; missed"
        colour = "#2ca02c" if ok else "#e6550d"
        label = " / ".join(escape(w) for w in b.words)
        items.append(
            f"<li><span style='color:{colour};font-weight:bold'>{mark}</span> "
            f"<code>{label}</code>: {escape(b.why)}</li>"
        )
    for p in g.wrong:
        text = words[p].text
        why = quiz.fine.get(_norm(text), "nothing is wrong with this word.")
        items.append(
            f"<li><span style='color:#d62728;font-weight:bold'>&#10007; marked by "
            f"mistake</span> <code>{escape(text)}</code>: {escape(why)}</li>"
        )
    extra = f", {len(g.wrong)} marked by mistake" if g.wrong else ""
    return (
        f"<div style='font-size:15px'><b>Score: {g.score}/{g.total}</b> "
        f"(found {len(g.found)} of {g.total}{extra})</div><ul>{''.join(items)}</ul>"
    )


class QuizWidget(PacksimWidget):
    """Spot-the-bug quiz; build it with :func:`quiz`. ``buttons`` are the word chips."""

    def __init__(self, quizzes: list[QuizData], index: int = 0):
        self.quizzes = quizzes
        self.picker = widgets.Dropdown(
            options=[(f"{i + 1}. {q.title}", i) for i, q in enumerate(quizzes)],
            value=index,
            description="quiz",
            layout=widgets.Layout(width="520px"),
        )
        self.intro = widgets.HTML()
        self.words_box = widgets.VBox()
        self.submit = widgets.Button(description="Submit", button_style="primary")
        self.submit.add_class("packsim-quiz-submit")
        self.clear = widgets.Button(description="Clear marks")
        self.result = widgets.HTML()
        self.result.add_class("packsim-quiz-result")
        self.submit.on_click(lambda _b: self.grade())
        self.clear.on_click(lambda _b: self.clear_marks())
        self.picker.observe(lambda c: self.show(c["new"]), names="value")
        self.buttons: list[widgets.Button] = []
        self.marked: set[int] = set()
        self._result_classes: dict[int, str] = {}
        self.widget = widgets.VBox(
            [
                style_html(),
                self.picker,
                self.intro,
                self.words_box,
                widgets.HBox([self.submit, self.clear]),
                self.result,
            ]
        )
        self.widget.add_class("packsim-quiz")
        self.show(index)

    @property
    def current(self) -> QuizData:
        return self.quizzes[self.picker.value]

    def show(self, index: int) -> None:
        """Show quiz ``index`` (new word chips, marks and result cleared)."""
        if self.picker.value != index:
            self.picker.value = index  # the observer calls show() again
            return
        q = self.current
        for row in self.words_box.children:
            close_tree(row)
        self.marked, self._result_classes = set(), {}
        self.buttons = []
        code = q.kind == "code"
        lines: dict[int, list] = {}
        indents: dict[int, int] = {}
        for w in q.words:
            b = widgets.Button(
                description=w.text,
                tooltip="click to mark / unmark",
                layout=widgets.Layout(width="auto", height="28px", margin="1px", padding="0 4px"),
            )
            if code:
                b.style.font_family = "monospace"
            b.add_class("packsim-quiz-word")
            b.on_click(lambda _b, i=w.index: self.toggle(i))
            self.buttons.append(b)
            lines.setdefault(w.line if code else 0, []).append(b)
            indents[w.line] = w.indent
        rows = []
        for ln, buttons in lines.items():
            pad = (
                widgets.HTML(layout=widgets.Layout(width=f"{0.6 * indents.get(ln, 0)}em"))
                if code
                else None
            )
            kids = ([pad] if pad is not None and indents.get(ln, 0) else []) + buttons
            rows.append(widgets.HBox(kids, layout=widgets.Layout(flex_flow="row wrap")))
        self.words_box.children = rows
        self.intro.value = (
            f"<b>{escape(q.title)}</b><br>{escape(q.intro or 'Mark every word that is wrong.')}"
            f" <i>({len(q.bugs)} to find; click a word to mark it, again to unmark, "
            "then submit.)</i>"
        )
        self.result.value = ""

    def figure(self) -> go.Figure:
        """The current quiz's answer key (see :func:`quiz_figure`)."""
        return _figure(self.current)

    def toggle(self, index: int) -> None:
        """Mark or unmark word ``index`` (what clicking a word does)."""
        b = self.buttons[index]
        if index in self.marked:
            self.marked.discard(index)
            b.remove_class("packsim-marked")
        else:
            self.marked.add(index)
            b.add_class("packsim-marked")

    def clear_marks(self) -> None:
        for i in sorted(self.marked):
            self.buttons[i].remove_class("packsim-marked")
        self.marked = set()
        self._set_result_classes({})
        self.result.value = ""

    def grade(self) -> Grade:
        """Score the marked words (what Submit does); shows the score and explanations."""
        q = self.current
        g = grade(q, self.marked)
        classes = {p: "packsim-wrong" for p in g.wrong}
        for bug in q.bugs:
            hit = [p for p in bug.positions if p in self.marked]
            for p in hit if hit else bug.positions:
                classes[p] = "packsim-hit" if hit else "packsim-miss"
        self._set_result_classes(classes)
        self.result.value = result_html(q, g)
        return g

    def _set_result_classes(self, classes: dict[int, str]) -> None:
        """Colour words after a submission, touching only words whose colour changes."""
        for p, cls in self._result_classes.items():
            if classes.get(p) != cls:
                self.buttons[p].remove_class(cls)
        for p, cls in classes.items():
            if self._result_classes.get(p) != cls:
                self.buttons[p].add_class(cls)
        self._result_classes = classes


def quiz(name_or_index=None, path=None) -> QuizWidget:
    """Spot-the-bug quiz widget (notebook 08).

    ``name_or_index``: a quiz name or 0-based index (default: the first; the dropdown switches).
    ``path``: a YAML file or folder of your own quizzes (default: the ones packsim ships).
    """
    quizzes, index = get_quiz(name_or_index, path)
    return QuizWidget(quizzes, index)


def quiz_figure(name_or_index=None, path=None) -> go.Figure:
    """Static answer key of a quiz (HTML export): the numbered passage, each wrong word and why."""
    quizzes, index = get_quiz(name_or_index, path)
    return _figure(quizzes[index])


def _figure(q: QuizData) -> go.Figure:
    words = q.words
    lines = q.passage.rstrip("\n").split("\n")
    where = [", ".join(sorted({str(words[p].line + 1) for p in b.positions})) for b in q.bugs]
    fig = make_subplots(
        rows=2,
        cols=1,
        specs=[[{"type": "table"}], [{"type": "table"}]],
        row_heights=[0.5, 0.5],
        vertical_spacing=0.04,
    )
    fig.add_trace(
        go.Table(
            columnwidth=[0.3, 6],
            header=dict(values=["line", "passage"], align="left", fill_color="#ddd"),
            cells=dict(
                values=[list(range(1, len(lines) + 1)), [escape(x) for x in lines]],
                align="left",
                font=dict(family="monospace" if q.kind == "code" else None),
            ),
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Table(
            columnwidth=[1.2, 0.5, 4],
            header=dict(values=["wrong word", "line", "why"], align="left", fill_color="#ddd"),
            cells=dict(
                values=[[" / ".join(b.words) for b in q.bugs], where, [b.why for b in q.bugs]],
                align="left",
            ),
        ),
        row=2,
        col=1,
    )
    fig.update_layout(
        title=f"{q.title}: answer key",
        height=260 + 24 * len(lines) + 80 * len(q.bugs),
        margin=dict(t=60),
    )
    return fig
