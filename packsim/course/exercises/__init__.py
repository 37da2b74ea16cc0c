"""Auto-checked exercises for the course notebooks: one module per lesson, one check per exercise.

Module ``lessonNN_<notebook name>`` holds lesson NN's checks, ``check_<name>``; the reference
solution of each is ``<name>`` in ``packsim.course.solutions.lessonNN_<notebook name>``, opened
only on purpose: ``show_solution(1, "ffd_pack")`` (the lesson number, then the exercise name)
prints one. A check takes what the learner wrote (a function or a value) and returns a
:class:`Feedback`: ``passed``, a message that says what is wrong on which input (each wrong item
of an answer) and a hint -- never a bare ``False``. It never raises because of the learner's code:
an unfinished stub (``...``, ``raise NotImplementedError``) reads "not done yet", any other
exception is reported, so a notebook with empty exercises runs top to bottom. In a notebook a
verdict is a coloured box (``*emphasis*`` and ```code``` rendered); from a script it prints as
text. ``tests/test_exercises.py`` runs every check on its solution and on typical wrong answers.

Lessons: 00, 01, 02, 03, 04, 05, 06, 07, 08, 09, 10, A1, A2, A3, A4, A5, A6, A7, A8.
"""

from __future__ import annotations

import functools
import html
import importlib
import inspect
import pkgutil
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

from packsim.core.errors import PacksimError

__all__ = ["Feedback", "check", "fail", "marks_to_html", "ok", "plain_text", "show_solution", "solution_source"]


@dataclass(frozen=True)
class Feedback:
    """The verdict of one check: ``passed``, a message, and a hint when it did not pass.

    ``bool(feedback)`` is ``passed``; it shows as a coloured box in a notebook and as one line of
    text elsewhere.
    """

    passed: bool
    message: str
    hint: str = ""
    exercise: str = ""
    attempted: bool = True

    def __bool__(self) -> bool:
        return self.passed

    @property
    def status(self) -> str:
        if self.passed:
            return "correct"
        return "wrong" if self.attempted else "not done yet"

    def __str__(self) -> str:
        head = f"[{self.exercise}] " if self.exercise else ""
        text = f"{head}{self.status}: {plain_text(self.message)}"
        hint = plain_text(self.hint)
        return f"{text}\n  hint: {hint}" if hint and not self.passed else text

    __repr__ = __str__

    def _repr_html_(self) -> str:
        from packsim.viz.feedback import feedback_html  # the box's markup and theme colours

        head = f"<b>{html.escape(self.exercise)}</b>: " if self.exercise else ""
        hint = f"<br><i>hint:</i> {marks_to_html(self.hint)}" if self.hint and not self.passed else ""
        return feedback_html(self.status, head, marks_to_html(self.message), hint)


# ``*word*`` / ``**word**`` emphasis and ```code``` marks that feedback texts may use.
_STRONG = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*")
_EM = re.compile(r"(?<![\w*])\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?![\w*])")
_CODE = re.compile(r"`([^`]+)`")


def plain_text(text: str) -> str:
    """``text`` without ``*emphasis*`` marks (for a terminal; ```code``` marks stay, they read well)."""
    return _EM.sub(r"\1", _STRONG.sub(r"\1", text))


def marks_to_html(text: str) -> str:
    """``text`` escaped for HTML, with ``**strong**``, ``*emphasis*`` and ```code``` rendered."""
    out = _CODE.sub(r"<code>\1</code>", html.escape(text))
    return _EM.sub(r"<em>\1</em>", _STRONG.sub(r"<b>\1</b>", out))


def _in_ipython() -> bool:
    """True inside IPython (a notebook kernel or the IPython shell), which displays a verdict."""
    ipython = sys.modules.get("IPython")
    return ipython is not None and ipython.get_ipython() is not None


def _announce(feedback: Feedback) -> None:
    """Print ``feedback`` when nothing else would show it: a script, not IPython or the ``>>>``
    prompt (both echo the returned verdict themselves)."""
    if not _in_ipython() and not hasattr(sys, "ps1"):
        print(feedback, flush=True)


def ok(message: str) -> Feedback:
    """A passing verdict (the check's name is filled in by :func:`check`)."""
    return Feedback(True, message)


def fail(message: str, hint: str = "") -> Feedback:
    """A failing verdict: ``message`` says what is wrong (on which input), ``hint`` how to fix it."""
    return Feedback(False, message, hint)


def _unfinished(answer) -> bool:
    return answer is ... or answer is None


def check(exercise: str) -> Callable:
    """Decorator for a check function ``fn(answer, ...) -> Feedback``.

    Turns an unfinished answer (``...``, ``None``, or code that raises ``NotImplementedError``)
    into "not done yet", and any other exception raised while running the learner's code into a
    failing verdict that names it. ``exercise`` labels the verdict. Outside IPython and the
    Python prompt (a script) the verdict is also printed (:func:`_announce`).
    """

    def wrap(fn: Callable[..., Feedback]) -> Callable[..., Feedback]:
        @functools.wraps(fn)
        def run(answer=..., *args, **kwargs) -> Feedback:
            feedback = _verdict(answer, *args, **kwargs)
            _announce(feedback)
            return feedback

        def _verdict(answer, *args, **kwargs) -> Feedback:
            def label(fb: Feedback, **changes) -> Feedback:
                return Feedback(**{**fb.__dict__, "exercise": exercise, **changes})

            if _unfinished(answer):
                return label(
                    fail("replace the `...` with your answer, run the cell, then run this check."),
                    attempted=False,
                )
            try:
                feedback = fn(answer, *args, **kwargs)
            except NotImplementedError:
                return label(
                    fail("your function still raises NotImplementedError: write its body."),
                    attempted=False,
                )
            except PacksimError as err:
                return label(fail(f"packsim rejected an input your code built: {err}"))
            except Exception as err:  # the learner's code failed: report it, never crash
                return label(
                    fail(
                        f"your code raised {type(err).__name__}: {err}",
                        "run your function by itself on a small input and read the traceback.",
                    )
                )
            return label(feedback)

        run.exercise = exercise
        return run

    return wrap


def lesson_modules(lesson: int | str) -> list[str]:
    """The solutions modules of a lesson: every ``lessonNN_*`` of its number (a lesson and the
    appendices it owns may have several), or the module name itself."""
    names = sorted(i.name for i in pkgutil.iter_modules(_solutions_path()))
    if isinstance(lesson, int) and not isinstance(lesson, bool):
        found = [n for n in names if n.startswith(f"lesson{lesson:02d}_")]
        if found:
            return found
    elif lesson in names:
        return [lesson]
    numbers = sorted(int(n[6:8]) for n in names)
    raise PacksimError(
        f"no solutions for lesson {lesson!r}: pass the lesson number, one of {numbers}, "
        'e.g. show_solution(1, "ffd_pack").'
    )


def _solutions_path():
    return importlib.import_module("packsim.course.solutions").__path__


def solution_source(lesson: int | str, name: str) -> str:
    """The source of reference solution ``name`` in the lesson's ``packsim.course.solutions`` module(s)."""
    modules = [importlib.import_module(f"packsim.course.solutions.{m}") for m in lesson_modules(lesson)]
    obj = next((getattr(m, name) for m in modules if hasattr(m, name)), None)
    if obj is None:
        names = [n for m in modules for n in vars(m) if not n.startswith("_") and n != "annotations"]
        where = ", ".join(m.__name__ for m in modules)
        raise PacksimError(f"{where} has no {name!r}; it has {names}.")
    if inspect.isfunction(obj) or inspect.isclass(obj):
        return inspect.getsource(obj)
    return f"{name} = {obj!r}\n"


def show_solution(lesson: int, name: str) -> None:
    """Print reference solution ``name`` of lesson number ``lesson``: ``show_solution(1, "ffd_pack")``.

    Example::

        >>> from packsim import show_solution
        >>> show_solution(1, "lower_bound")  # doctest: +ELLIPSIS
        def lower_bound(lengths, capacity: int) -> int:
        ...
    """
    print(solution_source(lesson, name))
