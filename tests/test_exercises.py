"""The exercise framework (packsim.course.exercises): verdicts, never-raising checks, solutions on demand."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import pytest

from packsim.core.errors import PacksimError
from packsim.course import exercises
from packsim.course.exercises import Feedback, check, fail, ok, show_solution, solution_source


@check("double")
def _check_double(fn) -> Feedback:
    if fn(2) != 4:
        return fail(f"double(2) returned {fn(2)!r}, expected 4.", "multiply by 2.")
    return ok("doubles.")


def test_verdicts_are_labelled_and_truthy():
    good, bad = _check_double(lambda x: 2 * x), _check_double(lambda x: x + 1)
    assert bool(good) and good.exercise == "double" and good.status == "correct"
    assert not bad and bad.status == "wrong" and bad.hint == "multiply by 2."
    assert str(bad) == "[double] wrong: double(2) returned 3, expected 4.\n  hint: multiply by 2."
    assert "hint" not in str(good)


def test_html_shows_status_and_hint_escaped():
    html = Feedback(False, "a < b", "use <b>", "ex")._repr_html_()
    assert "packsim-feedback-wrong" in html and "a &lt; b" in html and "use &lt;b&gt;" in html
    assert "packsim-feedback-correct" in ok("fine")._repr_html_()


def test_unfinished_and_crashing_answers_never_raise():
    def stub(x):
        raise NotImplementedError

    for unfinished in (..., None, stub):
        fb = _check_double(unfinished)
        assert not fb.attempted and fb.status == "not done yet" and not fb
    crash = _check_double(lambda x: [][x])
    assert crash.attempted and "IndexError" in crash.message and crash.hint


def test_solution_source_and_errors(capsys):
    assert "def padding_share" in solution_source("start_here", "padding_share")
    show_solution("start_here", "padding_share")
    assert "real_mask" in capsys.readouterr().out
    with pytest.raises(PacksimError, match="no solutions for lesson 'nope'"):
        solution_source("nope", "x")
    with pytest.raises(PacksimError, match="has no 'nope'.*padding_share"):
        solution_source("start_here", "nope")


# ---- every lesson's checks -------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def _course_checks() -> list[tuple[str, str, object]]:
    """(lesson module, exercise name, check) for every ``check_<name>`` in packsim.course.exercises."""
    found = []
    for info in pkgutil.iter_modules(exercises.__path__):
        module = importlib.import_module(f"packsim.course.exercises.{info.name}")
        for attr, fn in vars(module).items():
            if attr.startswith("check_") and hasattr(fn, "exercise"):
                found.append((info.name, attr.removeprefix("check_"), fn))
    return found


COURSE_CHECKS = _course_checks()
IDS = [f"{lesson}.{name}" for lesson, name, _ in COURSE_CHECKS]


def test_every_lesson_has_checks():
    assert len({lesson for lesson, _, _ in COURSE_CHECKS}) == 11 and len(COURSE_CHECKS) >= 18


@pytest.mark.parametrize(("lesson", "name", "check_fn"), COURSE_CHECKS, ids=IDS)
def test_reference_solution_passes_and_stub_is_not_done_yet(lesson, name, check_fn):
    solution = getattr(importlib.import_module(f"packsim.course.solutions.{lesson}"), name)
    fb = check_fn(solution)
    assert fb.passed and fb.attempted, fb
    assert solution_source(lesson, name)  # what show_solution prints

    def stub(*args, **kwargs):
        raise NotImplementedError

    for unfinished in (..., stub) if callable(solution) else (...,):  # the notebook's stub
        fb = check_fn(unfinished)
        assert not fb.passed and not fb.attempted and fb.status == "not done yet", fb


@pytest.mark.parametrize(("lesson", "name", "check_fn"), COURSE_CHECKS, ids=IDS)
def test_every_check_is_used_by_a_notebook(lesson, name, check_fn):
    sources = [p.read_text() for p in (ROOT / "notebooks").glob("*.ipynb")]
    assert any(f"check_{name}(" in s and f"exercises.{lesson} import" in s for s in sources)
