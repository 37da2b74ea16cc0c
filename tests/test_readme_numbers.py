"""The README's per-task numbers are the committed run's, with lesson 06's definition (mean [min, max] over seeds)."""

from __future__ import annotations

import re
from pathlib import Path

from packsim.experiment.results import Results

ROOT = Path(__file__).resolve().parents[1]


def _by_task(results: Results, setup: str, task: str) -> tuple[int, int, int]:
    vals = [r.final["isolated_exact_match_by_task"][task] for r in results.by_setup()[setup]]
    return tuple(round(100 * v) for v in (sum(vals) / len(vals), min(vals), max(vals)))


def test_readme_per_task_numbers_match_results_json():
    results = Results.load(ROOT / "results" / "tasks-full" / "results.json")
    text = " ".join((ROOT / "README.md").read_text().split())
    pct = r"(\d+)% \[(\d+)%, (\d+)%\]"
    m = re.search(rf"buggy gets reversal {pct} vs {pct} for correct, and addition {pct} vs {pct}", text)
    assert m, "README lost its per-task sentence (buggy vs correct, reversal and addition)"
    got = [int(x) for x in m.groups()]
    want = [*_by_task(results, "buggy", "reverse"), *_by_task(results, "correct", "reverse"),
            *_by_task(results, "buggy", "add"), *_by_task(results, "correct", "add")]
    assert got == want, f"README says {got}, results/tasks-full/results.json gives {want}"
