"""The exercise framework (packsim.course.exercises): verdicts, never-raising checks, solutions on demand."""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
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
    assert "def padding_share" in solution_source(0, "padding_share")
    show_solution(0, "padding_share")
    assert "real_mask" in capsys.readouterr().out
    assert solution_source("lesson00_start_here", "padding_share") == solution_source(0, "padding_share")
    for wrong in ("nope", "start_here", 42):  # the one form is the lesson number
        with pytest.raises(PacksimError, match=f"no solutions for lesson {wrong!r}: pass the lesson number"):
            solution_source(wrong, "x")
    with pytest.raises(PacksimError, match="has no 'nope'.*padding_share"):
        solution_source(0, "nope")


def test_every_show_solution_a_notebook_names_is_the_number_form_and_exists():
    """Each ``show_solution(...)`` a notebook mentions: a lesson number, and that solution exists."""
    calls = []
    appendices = sorted((ROOT / "notebooks").glob("A[0-9]_*.ipynb"))  # they name the lesson they came from
    for path in [*sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")), *appendices]:
        text = "".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"])
        calls += [(path.name, m.group(1), m.group(2)) for m in re.finditer(r"show_solution\(([^,()]*), *([^()]*)\)", text)]
    assert len(calls) >= 20, calls
    for notebook, lesson, name in calls:
        if lesson == "lesson":  # the general form, in lesson 00's prose
            continue
        assert lesson.isdigit() and (notebook.startswith("A") or int(lesson) == int(notebook[:2])), (notebook, lesson)
        assert solution_source(int(lesson), name.strip("\"'")), (notebook, name)


def test_a_notebook_that_names_show_solution_imports_it():
    """A hint that says ``show_solution(...)`` works as written: a code cell of that notebook imports it."""
    missing = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        named = any("show_solution(" in "".join(c["source"]) for c in cells)
        code = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        # show_solution's home (packsim.course.exercises) or the top face (packsim); one line or (...)
        imports = re.findall(r"from packsim(?:\.course\.exercises)? import (\([^)]*\)|[^\n]*)", code)
        if named and not any(re.search(r"\bshow_solution\b", names) for names in imports):
            missing.append(path.name)
    assert not missing, f"these notebooks name show_solution(...) but never import it: {missing}"


# ---- every lesson's checks -------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def _course_checks() -> list[tuple[str, str, object]]:
    """(lesson module, exercise name, check) for every ``check_<name>`` in packsim.course.exercises."""
    found = []
    for info in pkgutil.iter_modules(exercises.__path__):
        module = importlib.import_module(f"packsim.course.exercises.{info.name}")
        for attr, fn in vars(module).items():
            # defined there: a module may re-export another lesson's checks for its notebook's one import
            if attr.startswith("check_") and hasattr(fn, "exercise") and fn.__module__ == module.__name__:
                found.append((info.name, attr.removeprefix("check_"), fn))
    return found


COURSE_CHECKS = _course_checks()
IDS = [f"{lesson}.{name}" for lesson, name, _ in COURSE_CHECKS]


def test_every_lesson_has_checks():
    assert len({lesson[:8] for lesson, _, _ in COURSE_CHECKS}) == 11 and len(COURSE_CHECKS) >= 18  # lessons 00-10


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
    homes = [info.name for info in pkgutil.iter_modules(exercises.__path__)  # its lesson, or one re-exporting it
             if getattr(importlib.import_module(f"packsim.course.exercises.{info.name}"), f"check_{name}", None) is check_fn]
    assert any(f"check_{name}(" in s and any(f"exercises.{home} import" in s for home in homes) for s in sources)


# ---- where a verdict shows: scripts, markup, several wrong items (issue 23) --------------------


def test_a_check_called_from_a_script_prints_its_verdict(tmp_path):
    """A script's ``check_x(answer)`` on a line of its own prints the verdict (IPython and the
    ``>>>`` prompt show the returned value themselves, so nothing is printed there)."""
    import subprocess
    import sys

    script = tmp_path / "answer.py"
    script.write_text(
        "from packsim.course.exercises.lesson00_start_here import check_padding_share\n"
        "check_padding_share(lambda batch: 0.0)\n"
        "check_padding_share(...)\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("[")]
    assert len(lines) == 2 and "wrong:" in lines[0] and "not done yet:" in lines[1], done.stdout


def test_no_print_inside_ipython(monkeypatch, capsys):
    import IPython

    monkeypatch.setattr(IPython, "get_ipython", lambda: object())
    assert not _check_double(lambda x: x)
    assert capsys.readouterr().out == ""


def test_emphasis_marks_are_rendered_in_html_and_dropped_in_text():
    fb = Feedback(False, "the share of *real* tokens, not **all** of `x * y`", "use *k*", "ex")
    text, html = str(fb), fb._repr_html_()
    assert "*real*" not in text and "**all**" not in text and "use k" in text
    assert "`x * y`" in text  # code keeps its backquotes and its asterisk
    assert "<em>real</em>" in html and "<b>all</b>" in html and "<code>x * y</code>" in html
    assert "<em>k</em>" in html and "*" not in html.replace("x * y", "")


@pytest.mark.parametrize(("lesson", "name", "check_fn"), COURSE_CHECKS, ids=IDS)
def test_no_literal_asterisks_in_reference_feedback(lesson, name, check_fn):
    solution = getattr(importlib.import_module(f"packsim.course.solutions.{lesson}"), name)
    for fb in (check_fn(solution), check_fn(...)):
        assert "*" not in plain_text_without_code(str(fb)), fb


def plain_text_without_code(text: str) -> str:
    import re

    return re.sub(r"`[^`]*`", "", text)


def test_every_wrong_item_is_explained():
    """Two wrong items in a dict answer: the message explains both, not only the first."""
    from packsim.course.exercises.lesson07_detect_contamination import check_name_the_fix
    from packsim.course.exercises.lesson09_interview_drills import SYMPTOMS, check_diagnosis
    from packsim.course.solutions import lesson07_detect_contamination as s07
    from packsim.course.solutions import lesson09_interview_drills as s09

    swapped = dict(s07.name_the_fix)
    a, b = sorted(swapped)[:2]
    right_a, right_b = swapped[a], swapped[b]
    swapped[a], swapped[b] = (right_b, right_a) if right_a != right_b else ("x", "y")
    fb = check_name_the_fix(swapped)
    assert not fb and f"Report {a}:" in fb.message and f"Report {b}:" in fb.message, fb

    other = {"attention": "loss", "loss": "neither", "neither": "attention"}
    wrong = {**s09.diagnosis, "s1": other[s09.diagnosis["s1"]], "s6": other[s09.diagnosis["s6"]]}
    fb = check_diagnosis(wrong)
    assert not fb and "s1: you said" in fb.message and "s6: you said" in fb.message, fb
    assert len(SYMPTOMS) >= 2
