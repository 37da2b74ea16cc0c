"""packsim.course.tools.lesson_time: a learner's minutes per notebook, and the core path's budget (issue 23)."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from packsim.course.tools import lesson_time as lt

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


def _write(path: Path, *cells) -> Path:
    nbformat.write(new_notebook(cells=list(cells)), path)
    return path


def test_counts_words_code_cells_and_exercises(tmp_path):
    words = " ".join(["word"] * 396)
    nb = _write(
        tmp_path / "03_x.ipynb",
        new_markdown_cell(f"# 03 · Title\n\n{words} [a link](https://example.com/a/very/long/path)"),  # 4 + 396 + 2
        new_code_cell("x = 1"),
        new_code_cell("y = 2"),
        new_markdown_cell("## Exercises"),  # 2 words; a section heading, not an exercise
        new_code_cell("z = 3"),
        new_markdown_cell("### Exercise 1: do it"),  # 5 words
        new_code_cell("def f():\n    raise NotImplementedError"),  # inside the exercise: not counted
        new_code_cell("check_f(f)"),
        new_markdown_cell("## Recap"),  # 2 words
        new_code_cell("print('after the exercise')"),
    )
    t = lt.lesson_time(nb)
    assert (t.words, t.code_cells, t.exercises) == (411, 4, 1)
    expected = 411 / lt.WORDS_PER_MINUTE + 4 * lt.CODE_CELL_MINUTES + 1 * lt.EXERCISE_MINUTES
    assert t.minutes == pytest.approx(expected)


def test_constants_are_stated_in_the_docstring():
    doc = lt.__doc__
    for value in (lt.WORDS_PER_MINUTE, lt.CODE_CELL_MINUTES, int(lt.EXERCISE_MINUTES)):
        assert re.search(rf"\({re.escape(str(value))}\b", doc), value
    assert "not reading time" in doc or "is not counted" in doc


def test_core_and_appendix_names():
    assert lt.is_core("notebooks/03_block_diagonal.ipynb")
    assert not lt.is_core("notebooks/A1_packing_stopwatch.ipynb")
    assert not lt.is_core("notebooks/10_scaling_out.ipynb")  # an appendix as a whole


def test_the_core_path_fits_the_budget():
    core = [p for p in sorted(NOTEBOOKS.glob("*.ipynb")) if lt.is_core(p)]
    assert len(core) == 10, [p.stem for p in core]
    total = sum(lt.lesson_time(p).minutes for p in core)
    assert total <= lt.CORE_BUDGET_MINUTES, f"the core path takes {total:.0f} min, over {lt.CORE_BUDGET_MINUTES}"


def test_the_map_in_lesson_00_states_the_measured_minutes():
    """Lesson 00's tables print each notebook's minutes and the core total: they must be the tool's."""
    text = "\n".join(c.source for c in nbformat.read(NOTEBOOKS / "00_start_here.ipynb", as_version=4).cells)
    rows = re.findall(r"^\| \[`([\w]+)`\]\(\1\.ipynb\) \|.*\| (\d+) \|$", text, re.M)
    measured = {p.stem: round(lt.lesson_time(p).minutes) for p in NOTEBOOKS.glob("*.ipynb")}
    assert {stem for stem, _ in rows} == set(measured), "the map lists every notebook once"
    wrong = {stem: (int(m), measured[stem]) for stem, m in rows if int(m) != measured[stem]}
    assert not wrong, f"the map's minutes (stated, measured) are stale: {wrong}; rerun the tool"
    total = round(sum(lt.lesson_time(p).minutes for p in NOTEBOOKS.glob("*.ipynb") if lt.is_core(p)))
    assert f"about {total} minutes" in text


def test_the_readme_states_the_measured_minutes():
    """The README's lesson table (minutes column) and its core / appendix totals are the tool's."""
    text = (ROOT / "README.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| (?:core|appendix)[^|]*\|(?:[^|]*\|){4} (\d+) \| [^|]* \|$", text, re.M))
    times = {p.stem: lt.lesson_time(p).minutes for p in NOTEBOOKS.glob("*.ipynb")}
    assert set(rows) == set(times), "the README's table lists every notebook once"
    wrong = {stem: (int(m), round(times[stem])) for stem, m in rows.items() if int(m) != round(times[stem])}
    assert not wrong, f"the README's minutes (stated, measured) are stale: {wrong}"
    core = round(sum(t for stem, t in times.items() if lt.is_core(NOTEBOOKS / f"{stem}.ipynb")))
    rest = round(sum(t for stem, t in times.items() if not lt.is_core(NOTEBOOKS / f"{stem}.ipynb")))
    assert f"the core path: {core} min; the\nappendices: {rest} min" in text


def test_cli_prints_every_notebook_and_the_core_total(capsys):
    assert lt.main([str(NOTEBOOKS)]) == 0
    out = capsys.readouterr().out
    assert "01_why_pack" in out and "A1_packing_stopwatch" in out and "core path:" in out
    assert "method:" in out


def test_cli_without_notebooks_says_so(tmp_path, capsys):
    assert lt.main([str(tmp_path / "nope")]) == 2
    assert "no notebooks" in capsys.readouterr().err


def test_each_lessons_stated_time_is_the_measured_one():
    """A title cell's "about N minutes" is the tool's estimate, rounded (so it cannot drift)."""
    stated = {}
    for p in sorted(NOTEBOOKS.glob("*.ipynb")):
        m = re.search(r"[Aa]bout (\d+) minutes", nbformat.read(p, as_version=4).cells[0].source)
        if m:
            stated[p.stem] = (int(m.group(1)), round(lt.lesson_time(p).minutes))
    assert len(stated) >= 9, stated
    wrong = {k: v for k, v in stated.items() if v[0] != v[1]}
    assert not wrong, f"(stated, measured) minutes: {wrong}"
