"""Every PR or issue number the course cites is a link (issue 15).

A learner cannot check "#3796" or "PR 31629"; they can open
https://github.com/axolotl-ai-cloud/axolotl/pull/3796. The test scans the markdown cells of every
notebook and every quiz file (packsim/viz/quiz_files/*.yaml) for a bare reference, ``#NNNN``,
``PR NNNN`` / ``pull request NNNN`` / ``issue NNNN`` (with or without ``#``), and fails unless a
GitHub URL ending in that number (``.../pull/NNNN`` or ``.../issues/NNNN``) appears within
``WINDOW`` characters of it (a markdown link ``[org/repo#NNNN](https://...)`` always does).
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
WINDOW = 300  # characters either side of a reference in which its URL must appear
REFERENCE = re.compile(
    r"(?:(?<![\w&/#])#(?P<hash>\d{2,6})(?![\w])"
    r"|\b(?:PRs?|pull requests?|issues?)\s+#?(?P<word>\d{2,6})\b)",
    re.IGNORECASE,
)


def bare_references(text: str) -> list[str]:
    """The PR/issue references in ``text`` with no GitHub URL to that number nearby."""
    bare = []
    for m in REFERENCE.finditer(text):
        number = m.group("hash") or m.group("word")
        near = text[max(0, m.start() - WINDOW) : m.end() + WINDOW]
        if not re.search(rf"https://github\.com/[\w.-]+/[\w.-]+/(?:pull|issues)/{number}\b", near):
            bare.append(m.group(0))
    return bare


def _sources() -> list[tuple[str, str]]:
    found = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "markdown":
                found.append((f"{path.name} cell {i}", cell.source))
    for path in sorted((ROOT / "packsim" / "viz" / "quiz_files").glob("*.yaml")):
        found.append((str(path.relative_to(ROOT)), path.read_text()))
    return found


@pytest.mark.parametrize(("where", "text"), _sources(), ids=lambda x: x if isinstance(x, str) and len(x) < 60 else "")
def test_every_cited_pr_or_issue_is_a_link(where, text):
    bare = bare_references(text)
    assert not bare, f"{where}: {bare} without a GitHub URL to the same number nearby; make each a link"


def test_the_detector():
    assert bare_references("fixed in PR #3796.") == ["PR #3796"]
    assert bare_references("see #31629 and issue 1177") == ["#31629", "issue 1177"]
    assert bare_references("[axolotl#3796](https://github.com/axolotl-ai-cloud/axolotl/pull/3796)") == []
    assert bare_references("PR 39194 (https://github.com/huggingface/transformers/pull/39194)") == []
    assert bare_references("a link to the wrong number: #12 https://github.com/a/b/pull/13") == ["#12"]
    assert bare_references("# 05 · Train, lesson 09, 2048 tokens, colour #1a7f37, step #3") == []
