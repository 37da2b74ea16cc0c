"""Spot-the-bug quiz widget (notebook 09): click the wrong words of a passage, submit, get a score.

The quizzes, their YAML format and the grading live in :mod:`packsim.viz.quiz_data`; this
module shows one: a dropdown of quizzes, the passage as clickable word chips (code keeps its
lines and indentation), Submit and Clear, and the result (``Score: n/m`` and why each bug is
wrong; one list item per bug, ``frontend/quiz_item.html``). :func:`quiz_figure` is the static
answer key.

Lessons: 09.
"""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from packsim.viz.assets import template
from packsim.viz.quiz_data import Grade, QuizData, get_quiz, grade
from packsim.viz.style import layout
from packsim.viz.widget import PacksimWidget, close_tree, escape, style_html

__all__ = ["QuizWidget", "quiz", "quiz_figure", "result_html"]

_UNMARKED = "not marked: click (or Enter) to mark this word as wrong"
_MARKED = "marked as wrong: click (or Enter) to unmark"


def result_html(quiz: QuizData, g: Grade) -> str:
    """The result panel: ``Score: n/m`` and one explanation per bug and per wrong mark."""
    words = quiz.words
    item = template("quiz_item.html").substitute  # verdict in theme colours (widget.css) and words
    items = []
    for i, b in enumerate(quiz.bugs):
        ok = i in g.found
        items.append(item(verdict_class="packsim-ok" if ok else "packsim-bad",
                          mark="&#10003; found" if ok else "&#10007; missed",
                          words=" / ".join(escape(w) for w in b.words), why=escape(b.why)))
    for p in g.wrong:
        text = words[p].text
        items.append(item(verdict_class="packsim-bad", mark="&#10007; marked by mistake",
                          words=escape(text), why=escape(quiz.why_fine(text))))
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
                tooltip=_UNMARKED,
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
            "then submit. From the keyboard: Tab to a word, Enter or Space marks it.)</i>"
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
            b.tooltip = _UNMARKED
        else:
            self.marked.add(index)
            b.add_class("packsim-marked")
            b.tooltip = _MARKED  # the state in words (the title a screen reader reads), not only the outline

    def clear_marks(self) -> None:
        for i in sorted(self.marked):
            self.buttons[i].remove_class("packsim-marked")
            self.buttons[i].tooltip = _UNMARKED
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
    """Spot-the-bug quiz widget (notebook 09).

    ``name_or_index``: a quiz name or 0-based index (default: the first; the dropdown switches).
    ``path``: a YAML file or folder of your own quizzes (default: the ones packsim ships).
    """
    quizzes, index = get_quiz(name_or_index, path)
    return QuizWidget(quizzes, index)


def quiz_figure(name_or_index=None, path=None) -> go.Figure:
    """Static answer key of a quiz (HTML export): the numbered passage, each wrong word and why."""
    quizzes, index = get_quiz(name_or_index, path)
    return _figure(quizzes[index])


_HEAD, _DARK = "#dddddd", dict(color="#111111")  # a table header cell: its fill and its text, set together


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
            header=dict(values=["line", "passage"], align="left", fill_color=_HEAD, font=_DARK),
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
            header=dict(values=["wrong word", "line", "why"], align="left", fill_color=_HEAD, font=_DARK),
            cells=dict(
                values=[[" / ".join(b.words) for b in q.bugs], where, [b.why for b in q.bugs]],
                align="left",
            ),
        ),
        row=2,
        col=1,
    )
    return layout(fig, f"{q.title}: answer key", 260 + 24 * len(lines) + 80 * len(q.bugs))
