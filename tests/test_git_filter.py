"""Notebook outputs cannot land in git by accident (issue 23): the nbstripout filter.

``make setup`` runs ``nbstripout --install --attributes .gitattributes`` (the committed
``.gitattributes`` already names the filter). Checked in a scratch git repository: a notebook
saved with outputs (as JupyterLab's autosave does) is committed without them, while the copy on
disk keeps them; a lesson run in JupyterLab (outputs, counts, the kernel's language_info) leaves
nothing for git to commit (issue 32); the filter leaves every committed course notebook byte for
byte as it is; and the notebooks' no-outputs test judges what git would store, not the disk.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/: the no-outputs test's helper
from test_notebooks import committed_notebooks_with_outputs  # noqa: E402

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


def _committed_bytes(relpath: str) -> bytes:
    """A notebook as committed (HEAD), or the file itself outside a git checkout."""
    done = subprocess.run(["git", "-C", str(ROOT), "show", f"HEAD:{relpath}"], capture_output=True)
    return done.stdout if done.returncode == 0 else (ROOT / relpath).read_bytes()


def _as_run_in_jupyterlab(raw: bytes) -> str:
    """The notebook as JupyterLab saves it after Run All: outputs and counts in every code cell,
    cell timing and scroll state, the kernel's full language_info, widget state.

    The kernelspec is left as committed: JupyterLab also writes the running kernel's display name
    ("Python 3 (ipykernel)"), which the filter does not normalise (the committed notebooks carry two
    display names, so no one mapping keeps them all byte for byte).
    """
    nb = nbformat.reads(raw.decode(), as_version=nbformat.NO_CONVERT)
    for n, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        cell.execution_count = n + 1
        cell.outputs = [new_output("stream", name="stdout", text="ran\n"),
                        new_output("execute_result", {"text/plain": "42"}, execution_count=n + 1)]
        cell.metadata["execution"] = {"iopub.execute_input": "2026-12-02T10:00:00.000001Z"}
        cell.metadata["scrolled"] = True
    nb.metadata["language_info"] = {
        "codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py",
        "mimetype": "text/x-python", "name": "python", "nbconvert_exporter": "python",
        "pygments_lexer": "ipython3", "version": "3.12.3"}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}, "version_major": 2}}
    return nbformat.writes(nb) + "\n"


def test_a_lesson_run_in_jupyterlab_leaves_nothing_to_commit(repo):
    """Issue 32: run a lesson, and git sees no change (no outputs, no Python version committed)."""
    relpath = "notebooks/07_detect_contamination.ipynb"
    committed = _committed_bytes(relpath)
    assert b'"language_info": {\n   "name": "python"\n  }' in committed  # only the name is committed
    ran = _as_run_in_jupyterlab(committed)
    assert has_outputs(nbformat.reads(ran, as_version=4)) and '"version": "3.12.3"' in ran
    command = _git(repo, "config", "filter.nbstripout.clean").strip()
    piped = subprocess.run(command, shell=True, cwd=repo, input=ran.encode(), capture_output=True, check=True)
    assert piped.stdout == committed  # the clean filter, fed as git feeds it
    path = repo / relpath  # and git itself: committed clean, saved after a run
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(committed)
    _git(repo, "add", relpath)
    _git(repo, "commit", "-q", "-m", "lesson 07 as committed")
    path.write_text(ran)
    assert _git(repo, "diff", "--", relpath) == ""  # (`git status` lists it until the next add: its size changed)
    _git(repo, "add", relpath)
    assert _git(repo, "status", "--porcelain", "--", relpath) == ""  # git add stores nothing new
    assert has_outputs(nbformat.read(path, as_version=4))  # the learner's copy keeps its outputs


def test_no_outputs_test_judges_what_git_would_store(repo, tmp_path):
    """The notebooks' no-outputs test passes on a learner's run (the filter strips the outputs) and
    still fails on outputs that would really be committed: no filter, staged, or no git at all."""
    ran = _as_run_in_jupyterlab(_committed_bytes("notebooks/07_detect_contamination.ipynb"))
    folder = repo / "lessons"
    folder.mkdir()
    (folder / "run.ipynb").write_text(ran)
    assert committed_notebooks_with_outputs(folder) == []  # filter installed: git stores none

    plain = tmp_path / "no_git"  # outside any git checkout: the file on disk is what counts
    plain.mkdir()
    (plain / "run.ipynb").write_text(ran)
    assert committed_notebooks_with_outputs(plain) == [(plain / "run.ipynb").resolve()]

    bare = tmp_path / "no_filter"  # .gitattributes names the filter, `make git-filter` never ran
    bare.mkdir()
    _git(bare, "init", "-q")
    shutil.copy(ROOT / ".gitattributes", bare / ".gitattributes")
    (bare / "run.ipynb").write_text(ran)
    assert committed_notebooks_with_outputs(bare) == [(bare / "run.ipynb").resolve()]
    _git(bare, "add", "run.ipynb")  # staged with its outputs, then cleaned on disk: still committed
    nb = nbformat.reads(ran, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    del nb.metadata["widgets"]
    nbformat.write(nb, bare / "run.ipynb")
    assert committed_notebooks_with_outputs(bare) == [(bare / "run.ipynb").resolve()]
