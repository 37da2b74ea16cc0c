"""Auto-checked exercises for the course notebooks: one module per lesson, one check per exercise.

A check takes what the learner wrote (a function or a value) and returns a :class:`Feedback`:
``passed`` plus a message that says what is right or, when it is not, what is wrong on which
input and a hint for the fix -- never a bare ``False``; when several items of an answer are
wrong, the message explains each of them. A check never raises because of the
learner's code: an unfinished stub (``...`` or ``raise NotImplementedError``) reads "not done
yet", and any other exception is reported with its type and message. So a notebook whose
exercises are still empty runs top to bottom (CI executes every notebook that way).

Reference solutions live in :mod:`packsim.course.solutions`, one module per lesson with the same
name, so a learner opens them only on purpose: ``show_solution(1, "ffd_pack")`` (or
``show_solution("why_pack", "ffd_pack")``) prints one, or open
``packsim/course/solutions/lesson01_why_pack.py``. The tests run every check both ways: the
reference solution passes, and typical wrong answers fail with a message that names the mistake.

===============================  =========================  ======================================
module                           notebook                   checks
===============================  =========================  ======================================
``lesson00_start_here``          00_start_here              padding_share
``lesson01_why_pack``            01_why_pack                lower_bound, padding_waste, ffd_pack
``lesson02_the_leak``            02_the_leak                which_examples_move,
                                                            outside_attention_share
``lesson03_block_diagonal``      03_block_diagonal          cu_seqlens_from_lengths,
                                                            block_causal_mask
``lesson04_transformers_traps``  04_transformers_traps      position_ids_from_lengths
``lesson05_completion_only_loss``     05_completion_only_loss    completion_labels, per_token_loss,
                                                            correct_row, response_start
``lesson06_train_side_by_side``        06_train_side_by_side      em_gap, warning_sign, fix_share
``lesson07_detect_contamination``       07_detect_contamination    gradient_leak, name_the_fix,
                                                            isolating_call, perturbation_leak
``lesson08_flash_varlen_internals``    08_flash_varlen_internals  count_tiles, work_ratio,
                                                            classify_tiles
``lesson09_interview_drills``           09_interview_drills        review, q1_answer, diagnosis,
                                                            followups
``lesson10_scaling_out``         10_scaling_out             global_loss, backward_scale
===============================  =========================  ======================================

Where a verdict shows: in a notebook (IPython) it is a coloured box whose ``*emphasis*`` and
```code``` marks are rendered; called from a plain script the check prints it as text (marks
removed), so ``check_x(answer)`` on a line of its own is never silent; in the Python prompt it
echoes as the same text.

Each check is ``check_<name>`` in the module; its reference solution is ``<name>`` in
``packsim.course.solutions.<module>``. ``tests/test_exercises.py`` finds them all and runs both.

Lessons: 01, 02, 03, 04, 05, 06, 07, 08, 09, 10.
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
        # Colours readable on JupyterLab's light and dark themes (Okabe-Ito blue / vermillion,
        # the theme's own secondary text colour), and the mark says the status without colour.
        colour = ("#0072b2" if self.passed
                  else "#d55e00" if self.attempted else "var(--jp-ui-font-color2, #757575)")  # fmt: skip
        mark = "&#10004;" if self.passed else ("&#10008;" if self.attempted else "&#9998;")
        head = f"<b>{html.escape(self.exercise)}</b>: " if self.exercise else ""
        hint = f"<br><i>hint:</i> {marks_to_html(self.hint)}" if self.hint and not self.passed else ""
        return (
            f'<div class="packsim-feedback packsim-feedback-{self.status.replace(" ", "-")}" '
            f'style="border-left:5px solid {colour};padding:4px 10px;margin:4px 0">'
            f'<span style="color:{colour};font-weight:bold">{mark} {self.status}</span> {head}'
            f"{marks_to_html(self.message)}{hint}</div>"
        )


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


def lesson_module(lesson: int | str) -> str:
    """The solutions/exercises module name of a lesson: 1, "01", "why_pack" or "lesson01_why_pack"."""
    names = sorted(i.name for i in pkgutil.iter_modules(_solutions_path()))
    key = f"{int(lesson):02d}" if isinstance(lesson, int) or str(lesson).isdigit() else str(lesson)
    for name in names:
        if name == key or name.startswith(f"lesson{key}_") or name.split("_", 1)[-1] == key:
            return name
    raise PacksimError(
        f"no solutions for lesson {lesson!r}: use the lesson number (e.g. 1) or its module name "
        f"(one of {names})."
    )


def _solutions_path():
    return importlib.import_module("packsim.course.solutions").__path__


def solution_source(lesson: int | str, name: str) -> str:
    """The source of reference solution ``name`` in ``packsim.course.solutions.<lesson>``."""
    lesson = lesson_module(lesson)
    module = importlib.import_module(f"packsim.course.solutions.{lesson}")
    obj = getattr(module, name, None)
    if obj is None:
        names = [n for n in vars(module) if not n.startswith("_") and n != "annotations"]
        raise PacksimError(f"packsim.course.solutions.{lesson} has no {name!r}; it has {names}.")
    if inspect.isfunction(obj) or inspect.isclass(obj):
        return inspect.getsource(obj)
    return f"{name} = {obj!r}\n"


def show_solution(lesson: int | str, name: str) -> None:
    """Print reference solution ``name`` of ``lesson`` (a learner calls this on purpose)."""
    print(solution_source(lesson, name))
