"""Shared fixtures: seeded toy examples (from tests/toy.py) and a tiny model, small for a 2-core CPU."""

from __future__ import annotations

import os

import pytest
import torch
from toy import VOCAB, toy_examples

# Two cores: one thread per pytest-xdist worker (two workers fill them), else up to two.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else max(1, min(2, torch.get_num_threads())))
# The same for the processes the tests start (notebook kernels, JupyterLab's kernels, torchrun
# ranks, CLI runs): they inherit OMP_NUM_THREADS=1 under xdist, unless it is set already. With
# torch's default of one thread per core, two workers' processes put four busy threads on the two
# cores, and they slow each other down many times over: lessons 04 and A6 side by side took 46 s
# and 50 s with two threads each, 17 s and 16 s with one (fast mode, idle 2-core machine, 2026-12-02).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def examples():
    """Five examples of varied length (9..21 tokens), fits 2+ per row at capacity 32."""
    return toy_examples([(4, 3), (10, 5), (2, 5), (6, 9), (3, 4)], seed=1)


@pytest.fixture(scope="module")
def tiny_model():
    from packsim.core.model import build_model

    return build_model("tiny", vocab_size=VOCAB, seed=0)


# ---- make test: two pytest-xdist workers (-n 2) -------------------------------------------------
# One unit of work per test file (its module fixtures are built once, on one worker), except that
# each notebook is its own unit, so the two workers share the notebooks. pytest-xdist then runs the
# units with the most tests first, so the one-test notebook units mix with the files of many small
# tests; forcing the heaviest first instead (every notebook at once on both workers, the browser
# tests side by side) was slower and failed under that contention (2026-12-02, clean clone).
# HEAVY_FIRST orders the units of equal size: xdist's sort by test count is stable, so the
# one-test units run in collection order, the notebooks first (in file order: 00, 01, ..., A8).
HEAVY_FIRST = ("test_notebooks.py::test_notebook_runs_in_fast_mode", "browser/", "test_data_parallel.py",
               "test_compare.py", "test_static_site.py", "test_trainer_audit.py", "test_hybrid_traps.py",
               "test_museum", "test_exercises", "test_evidence.py")


def _unit(nodeid: str) -> str:
    return nodeid if "test_notebook_runs_in_fast_mode" in nodeid else nodeid.split("::", 1)[0]


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class FileOrNotebook(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return FileOrNotebook(config, log)


def pytest_collection_modifyitems(config, items):
    weight = lambda item: next((i for i, key in enumerate(HEAVY_FIRST) if key in item.nodeid),  # noqa: E731
                               len(HEAVY_FIRST))
    items.sort(key=weight)  # stable: file order inside each weight; every worker sorts the same way
