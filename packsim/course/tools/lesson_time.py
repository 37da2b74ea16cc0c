"""How long a learner spends on each lesson, estimated from its cells: ``python -m packsim.course.tools.lesson_time notebooks``.

The method (cells x reading time; the notebook's own run time is not reading time and is not
counted: a fast-mode run takes seconds to two minutes, see the README's lesson table):

- markdown: its words at ``WORDS_PER_MINUTE`` (200, a careful pace for technical prose); a
  link's target URL is not read, so ``[text](url)`` counts as its text;
- a code cell: ``CODE_CELL_MINUTES`` (0.5) to read it, run it and read what it prints or draws;
- an exercise (a markdown heading that starts ``Exercise``, or ``Drill``): ``EXERCISE_MINUTES``
  (4) to write the answer and run its check; the code cells under its heading (the stub and the
  check call) are part of that allowance, not counted again; its prompt's words are read as above.

A notebook named ``NN_*`` is a core lesson unless ``APPENDIX_LESSONS`` lists it; a notebook named
``A<n>_*`` is an appendix. ``main`` prints minutes per notebook, the core total and the appendices'.

Lessons: none directly.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

__all__ = ["APPENDIX_LESSONS", "CORE_BUDGET_MINUTES", "LessonTime", "is_core", "lesson_time", "main"]

WORDS_PER_MINUTE = 200
CODE_CELL_MINUTES = 0.5
EXERCISE_MINUTES = 4.0
CORE_BUDGET_MINUTES = 180  # issue 23: the core path in at most 3 hours, exercises included
APPENDIX_LESSONS = frozenset({"10"})  # numbered lessons that are appendices as a whole

_EXERCISE = re.compile(r"^#{2,4}\s+(?:Exercise|Drill)\b(?!s\s*$)", re.M)
_HEADING = re.compile(r"^#{1,4}\s", re.M)
_LINK_TARGET = re.compile(r"\]\([^)]*\)")


@dataclass(frozen=True)
class LessonTime:
    """One notebook's estimate: its words, code cells outside exercises, exercises and minutes."""

    notebook: str
    words: int
    code_cells: int
    exercises: int

    @property
    def minutes(self) -> float:
        return (self.words / WORDS_PER_MINUTE + self.code_cells * CODE_CELL_MINUTES
                + self.exercises * EXERCISE_MINUTES)


def _words(markdown: str) -> int:
    return len(_LINK_TARGET.sub("]", markdown).split())


def lesson_time(notebook: Path | str) -> LessonTime:
    """Count one notebook's words, code cells and exercises (see the module docstring)."""
    nb = nbformat.read(Path(notebook), as_version=4)
    words = code = exercises = 0
    in_exercise = False
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            words += _words(cell.source)
            if _HEADING.search(cell.source):
                # the last heading of the cell decides whether the cells after it are an exercise's
                last = [line for line in cell.source.splitlines() if _HEADING.match(line)][-1]
                in_exercise = bool(_EXERCISE.match(last))
            exercises += len(_EXERCISE.findall(cell.source))
        elif cell.cell_type == "code" and not in_exercise:
            code += 1
    return LessonTime(Path(notebook).stem, words, code, exercises)


def is_core(notebook: Path | str) -> bool:
    """A numbered lesson (``NN_*``) not in ``APPENDIX_LESSONS``; appendices are ``A<n>_*``."""
    prefix = Path(notebook).name.split("_", 1)[0]
    return prefix.isdigit() and prefix not in APPENDIX_LESSONS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packsim.course.tools.lesson_time",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("folder", nargs="?", default="notebooks", help="the notebooks' folder")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    notebooks = sorted(folder.glob("*.ipynb")) if folder.is_dir() else []
    if not notebooks:
        print(f"error: no notebooks in {folder}: give the course's notebooks folder", file=sys.stderr)
        return 2
    rows = [(lesson_time(p), is_core(p)) for p in notebooks]
    print(f"{'notebook':34} {'part':8} {'words':>6} {'cells':>5} {'exerc.':>6} {'minutes':>7}")
    for t, core in rows:
        print(f"{t.notebook:34} {'core' if core else 'appendix':8} {t.words:6} {t.code_cells:5} "
              f"{t.exercises:6} {t.minutes:7.0f}")
    core_total = sum(t.minutes for t, core in rows if core)
    appendix_total = sum(t.minutes for t, core in rows if not core)
    print(f"core path: {core_total:.0f} min ({core_total / 60:.1f} h; budget {CORE_BUDGET_MINUTES} min), "
          f"appendices: {appendix_total:.0f} min")
    print(f"method: words / {WORDS_PER_MINUTE} per min + {CODE_CELL_MINUTES} min per code cell "
          f"+ {EXERCISE_MINUTES:.0f} min per exercise (its own cells included); run time not counted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
