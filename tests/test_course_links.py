"""The course's cross-references stay true when lessons are added or renumbered.

Every link to a notebook (``[text](NN_name.ipynb)``, ``notebooks/NN_name.ipynb``), every
backticked notebook name (`` `NN_name` ``), every ``lessonNN_name`` module and every
"lesson NN" / "notebook NN" in the notebooks, README.md, docs/*.md and the library's docstrings
names a lesson that exists; each notebook's title carries its own number and its "Next:" line
names the notebook after it. Appendices (``A<n>_name.ipynb``, issue 23) are numbered A1, A2, ...
without gaps, each is linked from its lesson and from lesson 00's map, links back to its lesson,
and every "appendix A<n>" mentioned exists.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
STEMS = [p.stem for p in NOTEBOOKS]
APPENDICES = sorted((ROOT / "notebooks").glob("A[0-9]_*.ipynb"))
APPENDIX_STEMS = [p.stem for p in APPENDICES]
ALL_STEMS = STEMS + APPENDIX_STEMS
NUMBERS = {stem[:2] for stem in STEMS}
MODULES = {
    p.stem
    for sub in ("exercises", "solutions", "cases")
    for p in (ROOT / "packsim" / "course" / sub).glob("lesson[0-9][0-9]_*.py")
}

LINK = re.compile(r"\]\(([^)\s]+\.ipynb)\)")  # markdown link target
NB_FILE = re.compile(r"(?<![\w/.-])((?:notebooks/)?(?:\d\d|A\d)_[a-z][a-z0-9_]*\.ipynb)")  # a path anywhere
BACKTICKED = re.compile(r"`((?:\d\d|A\d)_[a-z][a-z0-9_]*)`")
APPENDIX_MENTION = re.compile(r"\b[Aa]ppendi(?:x|ces)\s+(A\d(?:" + r"(?:\s*,\s*|\s+and\s+|\s+or\s+)" + r"A\d)*)\b")
APPENDIX_TITLE = re.compile(r"^# (A\d) · \S")
MODULE = re.compile(r"\b(lesson\d\d_[a-z][a-z0-9_]*)")
SEP = r"(?:\s*,\s*|\s+and\s+|\s*-\s*|\s+or\s+)"
MENTION = re.compile(r"\b(?:[Ll]essons?|[Nn]otebooks?)\s+(\d\d(?:" + SEP + r"\d\d)*)\b")
TITLE = re.compile(r"^# (\d\d) · \S")
NEXT = re.compile(r"\*\*Next: `([^`]+)`\*\*")


def _texts() -> list[tuple[Path, str]]:
    """(file, text) for every notebook cell, README.md, docs/*.md and the library's modules."""
    out = []
    for nb_path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(nb_path, as_version=4)
        out += [(nb_path, cell.source) for cell in nb.cells]
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        out.append((path, path.read_text(encoding="utf-8")))
    for path in sorted((ROOT / "packsim").rglob("*.py")):
        out.append((path, path.read_text(encoding="utf-8")))
    return out


TEXTS = _texts()


def _where(path: Path, text: str, pos: int) -> str:
    return f"{path.relative_to(ROOT)} line {text.count(chr(10), 0, pos) + 1}"


def test_the_course_is_numbered_without_gaps():
    assert STEMS and [s[:2] for s in STEMS] == [f"{i:02d}" for i in range(len(STEMS))], STEMS


def test_links_to_notebooks_resolve():
    broken = []
    for path, text in TEXTS:
        for m in LINK.finditer(text):
            target = m.group(1)
            if "://" not in target and not (path.parent / target).exists():
                broken.append(f"{_where(path, text, m.start())}: ({target})")
        for m in NB_FILE.finditer(text):
            if not (ROOT / "notebooks" / Path(m.group(1)).name).exists():
                broken.append(f"{_where(path, text, m.start())}: {m.group(1)}")
    assert not broken, f"links to notebooks that do not exist: {broken}; notebooks: {STEMS}"


def test_backticked_notebook_names_exist():
    unknown = [
        f"{_where(path, text, m.start())}: `{m.group(1)}`"
        for path, text in TEXTS
        for m in BACKTICKED.finditer(text)
        if m.group(1) not in ALL_STEMS
    ]
    assert not unknown, f"notebook names that are not in notebooks/: {unknown}; notebooks: {ALL_STEMS}"


def test_lesson_modules_named_exist_and_match_their_notebook():
    wrong = []
    for path, text in TEXTS:
        for m in MODULE.finditer(text):
            name = m.group(1)
            if name not in MODULES:
                wrong.append(f"{_where(path, text, m.start())}: {name}")
    assert not wrong, f"exercise/solution modules that do not exist: {wrong}"
    assert {m[6:8] for m in MODULES} <= NUMBERS, "an exercise module without its notebook"


def test_lesson_numbers_mentioned_exist():
    unknown = []
    for path, text in TEXTS:
        for m in MENTION.finditer(text):
            for number in re.findall(r"\d\d", m.group(1)):
                if number not in NUMBERS:
                    unknown.append(f"{_where(path, text, m.start())}: {m.group(0)!r}")
    assert not unknown, f"lessons that do not exist (the course has {sorted(NUMBERS)}): {unknown}"


@pytest.mark.parametrize("index", range(len(NOTEBOOKS)), ids=STEMS)
def test_title_number_and_next_line(index):
    nb = nbformat.read(NOTEBOOKS[index], as_version=4)
    stem = STEMS[index]
    title = nb.cells[0].source.splitlines()[0]
    m = TITLE.match(title)
    if index == 0:  # the course's front page carries the project's name instead
        assert title.startswith("# ") and (m is None or m.group(1) == "00"), title
    else:
        assert m and m.group(1) == stem[:2], f"{stem}: its title {title!r} should start '# {stem[:2]} · '"
    nexts = [n for cell in nb.cells if cell.cell_type == "markdown" for n in NEXT.findall(cell.source)]
    if index + 1 < len(STEMS):
        assert nexts == [STEMS[index + 1]], f"{stem}: its 'Next:' line names {nexts}, not {STEMS[index + 1]!r}"
    else:
        assert nexts == [], f"{stem} is the last lesson but names a next one: {nexts}"


# ---- appendices (issue 23: a core path, deep dives in appendices the core links to) -------------


def test_appendices_are_numbered_without_gaps_and_titled():
    assert APPENDIX_STEMS, "no appendix notebooks (notebooks/A1_*.ipynb, ...)"
    assert [s[:2] for s in APPENDIX_STEMS] == [f"A{i}" for i in range(1, len(APPENDIX_STEMS) + 1)], APPENDIX_STEMS
    for path in APPENDICES:
        title = nbformat.read(path, as_version=4).cells[0].source.splitlines()[0]
        m = APPENDIX_TITLE.match(title)
        assert m and m.group(1) == path.stem[:2], f"{path.stem}: its title {title!r} should start '# {path.stem[:2]} · '"


def _links(path: Path) -> set[str]:
    nb = nbformat.read(path, as_version=4)
    return {Path(t).stem for cell in nb.cells for t in LINK.findall(cell.source)}


@pytest.mark.parametrize("appendix", APPENDICES, ids=APPENDIX_STEMS)
def test_each_appendix_is_linked_from_its_lesson_and_the_map_and_links_back(appendix):
    text = "\n".join(c.source for c in nbformat.read(appendix, as_version=4).cells)
    back = re.findall(r"\*\*Back to lesson (\d\d)\*\*: \[[^]]*\]\(((\d\d)_[a-z0-9_]+)\.ipynb\)", text)
    assert len(back) == 1 and back[0][0] == back[0][2], f"{appendix.stem}: one '**Back to lesson NN**: [..](NN_name.ipynb)' line"
    lesson = ROOT / "notebooks" / f"{back[0][1]}.ipynb"
    assert appendix.stem in _links(lesson), f"lesson {back[0][1]} does not link to {appendix.stem}"
    assert appendix.stem in _links(ROOT / "notebooks" / "00_start_here.ipynb"), f"the map does not list {appendix.stem}"
    nexts = [n for c in nbformat.read(appendix, as_version=4).cells for n in NEXT.findall(c.source)]
    assert nexts == [], f"{appendix.stem}: an appendix has no 'Next:' line (it links back instead): {nexts}"


def test_appendices_mentioned_exist():
    names = {s[:2] for s in APPENDIX_STEMS}
    unknown = [
        f"{_where(path, text, m.start())}: {m.group(0)!r}"
        for path, text in TEXTS
        for m in APPENDIX_MENTION.finditer(text)
        if not set(re.findall(r"A\d", m.group(1))) <= names
    ]
    assert not unknown, f"appendices that do not exist (there are {sorted(names)}): {unknown}"
