"""The course notebooks: committed without outputs, and each runs top to bottom in fast mode."""

from __future__ import annotations

import math
import shlex
import subprocess
import threading
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from packsim.course.tools.notebook_tools import (
    NotebookRunError,
    execute_notebook,
    has_outputs,
    main,
    notebooks_with_outputs,
    strip_outputs,
)

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
COURSE = sorted(NOTEBOOKS.glob("*.ipynb"))

# A notebook's time limit follows the machine's speed while it runs, so that contention cannot
# fail it: a background thread times a fixed single-thread Python workload every second during the
# run (SAMPLE_IDLE_S on the idle 2-core CI machine: 0.019-0.021 s measured there, 2026-12-02), and
# the lesson may take BUDGET_S times the mean slowdown seen, never less than BUDGET_S. CEILING_S
# stops a real hang. (Measuring once before the lesson was not enough: on CI lesson 06 ran 218 s
# against a 202 s limit because the other worker's heavy tests started after the measurement.)
SAMPLE_IDLE_S = 0.02
BUDGET_S = 180.0
CEILING_S = 900.0


def sample_seconds() -> float:
    """One timing of the reference workload: 200,000 steps of a Python loop on one thread."""
    start = time.perf_counter()
    total = 0
    for i in range(200_000):
        total += i * i
    return time.perf_counter() - start


class ContentionMeter:
    """Times ``sample_seconds`` every ``every_s`` seconds in a daemon thread while in the block."""

    def __init__(self, every_s: float = 1.0, sample=sample_seconds):
        self.every_s, self.sample, self.samples = every_s, sample, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append(self.sample())
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> ContentionMeter:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def slowdown(self) -> float:
        """Mean of each sample's slowdown against the idle machine (a faster moment counts as 1)."""
        return sum(max(1.0, s / SAMPLE_IDLE_S) for s in self.samples) / len(self.samples)


def notebook_limit(slowdown: float) -> float:
    """The time limit for one notebook, given the mean slowdown measured while it ran."""
    return min(BUDGET_S * max(1.0, slowdown), CEILING_S)


def run_within_budget(notebook: Path, cwd: Path | None = None) -> tuple[float, float]:
    """Execute ``notebook`` (hard stop at CEILING_S); fail if it took over its contention budget."""
    with ContentionMeter() as meter:
        seconds = execute_notebook(notebook, timeout=CEILING_S, cwd=cwd)
    limit = notebook_limit(meter.slowdown)
    assert seconds <= limit, (
        f"{notebook.name} took {seconds:.0f} s, over its limit of {limit:.0f} s ({BUDGET_S:.0f} s "
        f"x the machine's slowdown {meter.slowdown:.2f} measured during the run): make its fast mode lighter"
    )
    return seconds, meter.slowdown


def test_notebook_limit_scales_with_the_slowdown_and_keeps_a_ceiling():
    assert notebook_limit(0.5) == BUDGET_S  # a faster machine keeps the idle budget
    assert notebook_limit(1.0) == BUDGET_S
    assert notebook_limit(3.0) == pytest.approx(3 * BUDGET_S)
    assert notebook_limit(1000.0) == CEILING_S  # a hang is still caught


def test_contention_meter_averages_the_slowdown_of_its_samples():
    times = iter([SAMPLE_IDLE_S, 3 * SAMPLE_IDLE_S, SAMPLE_IDLE_S / 2] + [SAMPLE_IDLE_S] * 1000)
    with ContentionMeter(every_s=0.001, sample=lambda: next(times)) as meter:
        while len(meter.samples) < 3:
            time.sleep(0.001)
    first = meter.samples[:3]
    assert first == [SAMPLE_IDLE_S, 3 * SAMPLE_IDLE_S, SAMPLE_IDLE_S / 2]
    n = len(meter.samples)  # (1 + 3 + 1 + the rest at 1) / n
    assert meter.slowdown == pytest.approx((5 + (n - 3)) / n)


def test_reference_workload_is_measurable():
    seconds = sample_seconds()
    assert math.isfinite(seconds) and seconds > 0


def _write(path: Path, *cells) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nb = new_notebook(cells=list(cells))
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, path)
    return path


# ---- outputs ----------------------------------------------------------------------------------


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True)
    except FileNotFoundError:  # no git installed: nothing is committed through it
        return subprocess.CompletedProcess(args, 128, b"", b"")


def as_git_would_store(paths: list[Path], folder: Path) -> dict[Path, bytes]:
    """What ``git add`` would store for each notebook of ``folder``'s checkout: its bytes run through
    the clean filter .gitattributes names (``make git-filter`` configures nbstripout), the command
    fed on stdin as git feeds it; the bytes on disk where no filter is configured or no git checkout
    holds ``folder``."""
    top = _git(folder, "rev-parse", "--show-toplevel")
    if top.returncode != 0 or not paths:
        return {p: p.read_bytes() for p in paths}
    top = Path(top.stdout.decode().strip()).resolve()
    rel = [p.resolve().relative_to(top).as_posix() for p in paths]
    attrs = _git(top, "check-attr", "filter", "--", *rel).stdout.decode().splitlines()  # "path: filter: name"
    stored = {}
    for path, name, line in zip(paths, rel, attrs, strict=True):
        driver = line.rsplit(": ", 1)[1]
        clean = _git(top, "config", "--get", f"filter.{driver}.clean")
        if driver in ("unspecified", "unset", "set") or clean.returncode != 0:
            stored[path] = path.read_bytes()
            continue
        command = clean.stdout.decode().strip().replace("%f", shlex.quote(name))
        done = subprocess.run(command, shell=True, cwd=top, input=path.read_bytes(), capture_output=True)
        assert done.returncode == 0, f"git's clean filter `{command}` failed on {name}: {done.stderr.decode()}"
        stored[path] = done.stdout
    return stored


def committed_notebooks_with_outputs(folder: Path) -> list[Path]:
    """The notebooks of ``folder`` that the next commit would store with outputs: those staged so,
    and those on disk with outputs that git's clean filter does not strip (a filter only removes,
    so a notebook clean on disk is clean in what it stores)."""
    found = set()
    top = _git(folder, "rev-parse", "--show-toplevel")
    if top.returncode == 0:  # the index: what `git commit` stores without another `git add`
        top = Path(top.stdout.decode().strip()).resolve()
        staged = _git(top, "diff", "--cached", "--name-only", "--diff-filter=AM", "--", str(folder.resolve()))
        for name in staged.stdout.decode().split():
            if name.endswith(".ipynb") and has_outputs(nbformat.reads(_git(top, "show", f":{name}").stdout.decode(),
                                                                      as_version=4)):
                found.add((top / name).resolve())
    dirty = notebooks_with_outputs(folder)  # on disk: what `git add` reads
    for path, stored in as_git_would_store(dirty, folder).items():
        if has_outputs(nbformat.reads(stored.decode(), as_version=4)):
            found.add(path.resolve())
    return sorted(found)


def test_committed_notebooks_have_no_outputs():
    """What git would commit carries no outputs. A learner's run leaves outputs on disk; the
    nbstripout filter (``make git-filter``) strips them from what git stores, so that passes;
    without the filter or outside a git checkout, the files on disk are judged."""
    dirty = committed_notebooks_with_outputs(NOTEBOOKS)
    assert not dirty, (
        f"notebooks that would be committed with outputs: {[str(p) for p in dirty]}; run `make git-filter` "
        "(git then strips outputs on git add) or `python -m packsim.course.tools.notebook_tools strip notebooks`"
    )


def test_strip_finds_and_removes_outputs(tmp_path):
    clean = _write(tmp_path / "clean.ipynb", new_markdown_cell("# hi"), new_code_cell("x = 1"))
    with_output = new_code_cell("print(1)", execution_count=3)
    with_output.outputs = [new_output("stream", name="stdout", text="1\n")]
    dirty = _write(tmp_path / "lessons" / "dirty.ipynb", with_output)
    counted = _write(
        tmp_path / "lessons" / "counted.ipynb", new_code_cell("y = 2", execution_count=1)
    )

    assert notebooks_with_outputs(tmp_path) == [counted, dirty]  # recursive, sorted
    assert main(["check-clean", str(tmp_path)]) == 1

    clean_bytes = clean.read_bytes()
    assert [strip_outputs(p) for p in (clean, dirty, counted)] == [False, True, True]
    assert clean.read_bytes() == clean_bytes  # an already clean file is not rewritten
    assert notebooks_with_outputs(tmp_path) == []
    assert main(["check-clean", str(tmp_path)]) == 0

    cell = nbformat.read(dirty, as_version=4).cells[0]
    assert (cell.source, cell.outputs, cell.execution_count) == ("print(1)", [], None)


def test_check_clean_tells_how_to_fix(tmp_path, capsys):
    _write(tmp_path / "a.ipynb", new_code_cell("1", execution_count=1))
    assert main(["check-clean", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "a.ipynb" in out and "python -m packsim.course.tools.notebook_tools strip notebooks" in out


def test_missing_folder_is_an_error(tmp_path):
    assert main(["check-clean", str(tmp_path / "nope")]) == 2


# ---- execution ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_execute_reports_failing_cell_and_uses_notebook_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PACKSIM_FAST", "1")
    nb = _write(
        tmp_path / "lesson" / "fails.ipynb",
        new_code_cell(
            "import os, pathlib\n"
            "assert pathlib.Path.cwd().name == 'lesson', pathlib.Path.cwd()\n"
            "assert os.environ['PACKSIM_FAST'] == '1'"
        ),
        new_code_cell("raise ValueError('boom')"),
    )
    with pytest.raises(NotebookRunError, match=r"cell 1 failed[\s\S]*ValueError: boom") as err:
        execute_notebook(nb, timeout=60)
    assert "raise ValueError('boom')" in str(err.value)  # the cell's source is quoted
    assert not nbformat.read(nb, as_version=4).cells[1].outputs  # nothing written back


# Lesson 09 reads results/ and benchmarks/results/: it runs with the kernel started elsewhere, as
# on Colab (/content) or VS Code, which proves it finds them from any working directory.
FROM_ELSEWHERE = {"09_interview_drills"}


@pytest.mark.slow
@pytest.mark.parametrize("notebook", COURSE, ids=[p.stem for p in COURSE])
def test_notebook_runs_in_fast_mode(notebook, monkeypatch, record_property, tmp_path):
    monkeypatch.setenv("PACKSIM_FAST", "1")  # inherited by the kernel
    workdir = None
    if notebook.stem in FROM_ELSEWHERE:
        workdir = tmp_path / "content"  # like Colab's /content: no results/ above it
        workdir.mkdir()
    seconds, slowdown = run_within_budget(notebook, cwd=workdir)
    record_property("wall_s", round(seconds, 2))
    record_property("slowdown", round(slowdown, 2))
    print(f"{notebook.name}: {seconds:.1f} s (machine slowdown {slowdown:.2f} during the run)")
    assert math.isfinite(seconds) and seconds > 0
    if workdir is not None:
        assert not any(workdir.iterdir())  # the lesson writes nothing where it happens to start


def test_every_notebook_run_from_elsewhere_exists():  # a rename must not empty the set silently
    assert FROM_ELSEWHERE <= {p.stem for p in COURSE}


def test_every_notebook_names_the_kernel_jupyterlab_writes_back():
    """A save in JupyterLab writes the running kernel's spec into metadata.kernelspec; committed with
    another display name, every learner's save shows up as a diff (00 and the browser fixture said
    "Python 3 (ipykernel)", 17 lessons "Python 3"). The spec is ipykernel's own, read here."""
    from ipykernel.kernelspec import get_kernel_dict

    spec = get_kernel_dict()
    want = {"name": "python3", "display_name": spec["display_name"], "language": spec["language"]}
    paths = [*COURSE, Path(__file__).resolve().parent / "browser" / "widgets_e2e.ipynb"]
    wrong = [p.name for p in paths if dict(nbformat.read(p, as_version=4).metadata.get("kernelspec", {})) != want]
    assert not wrong, f"kernelspec differs from {want} in {wrong}"
