"""Notebook outputs cannot land in git by accident (issue 23): the nbstripout filter.

``make setup`` runs ``nbstripout --install --attributes .gitattributes`` (the committed
``.gitattributes`` already names the filter). Checked in a scratch git repository: a notebook
saved with outputs (as JupyterLab's autosave does) is committed without them, while the copy on
disk keeps them; and the filter leaves every committed course notebook byte for byte as it is.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from packsim.course.tools.notebook_tools import find_notebooks, has_outputs

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("nbstripout", reason="nbstripout is a dev dependency: pip install -e '.[dev]'")
pytestmark = pytest.mark.skipif(not (shutil.which("git") and shutil.which("make")), reason="needs git and make")


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True)
    return done.stdout


@pytest.fixture(scope="module")
def repo(tmp_path_factory):  # one scratch repository for the module: the install takes seconds
    tmp_path = tmp_path_factory.mktemp("repo")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "t@example.com")
    _git(tmp_path, "config", "user.name", "t")
    shutil.copy(ROOT / ".gitattributes", tmp_path / ".gitattributes")
    # the Makefile's own recipe, run in the scratch repository with this interpreter
    subprocess.run(["make", "-s", "-f", str(ROOT / "Makefile"), "git-filter", f"PY={sys.executable}"],
                   cwd=tmp_path, check=True, capture_output=True)
    return tmp_path


def test_gitattributes_names_the_filter_once(repo):
    text = (repo / ".gitattributes").read_text()
    assert text.count("*.ipynb filter=nbstripout") == 1  # install adds nothing to the committed file
    assert "*.ipynb filter=nbstripout" in (ROOT / ".gitattributes").read_text()
    assert "nbstripout --install --attributes .gitattributes" in (ROOT / "Makefile").read_text()


def test_outputs_are_stripped_on_commit_and_kept_on_disk(repo):
    nb = new_notebook(cells=[new_code_cell("1 + 1", execution_count=1,
                                           outputs=[new_output("execute_result", {"text/plain": "2"},
                                                               execution_count=1)])])
    nbformat.write(nb, repo / "lesson.ipynb")
    _git(repo, "add", "lesson.ipynb")
    _git(repo, "commit", "-q", "-m", "autosaved notebook")
    committed = nbformat.reads(_git(repo, "show", "HEAD:lesson.ipynb"), as_version=4)
    assert not has_outputs(committed) and committed.cells[0].source == "1 + 1"
    assert has_outputs(nbformat.read(repo / "lesson.ipynb", as_version=4))  # the learner's copy


def test_committed_notebooks_pass_through_unchanged(repo, tmp_path):
    """The filter must not rewrite a clean notebook (no spurious diffs for anyone).

    The configured clean command runs once over copies of every notebook (in place: one process,
    not one per notebook), and once as git runs it (stdin to stdout) on the first, to show the two
    modes write the same bytes.
    """
    command = _git(repo, "config", "filter.nbstripout.clean").strip()
    originals = [p for p in find_notebooks([ROOT / "notebooks", ROOT / "tests" / "browser"])
                 if not has_outputs(nbformat.read(p, as_version=4))]  # one being edited: make check reports it
    copies = tmp_path / "copies"
    copies.mkdir()
    paths = [copies / f"{i:02d}_{p.name}" for i, p in enumerate(originals)]
    for original, copy in zip(originals, paths, strict=True):
        shutil.copy(original, copy)
    subprocess.run(f"{command} {' '.join(shlex.quote(str(p)) for p in paths)}", shell=True, check=True,
                   capture_output=True)
    changed = [o.name for o, c in zip(originals, paths, strict=True) if c.read_bytes() != o.read_bytes()]
    assert not changed, f"the nbstripout filter rewrites these committed notebooks: {changed}"
    raw = originals[0].read_bytes()
    piped = subprocess.run(command, shell=True, input=raw, capture_output=True, check=True).stdout
    assert piped == raw, originals[0].name
