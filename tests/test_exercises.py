"""The exercise framework (packsim.exercises): verdicts, never-raising checks, solutions on demand."""

from __future__ import annotations

import pytest

from packsim.errors import PacksimError
from packsim.exercises import Feedback, check, fail, ok, show_solution, solution_source


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
