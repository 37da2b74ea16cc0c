"""The experiment's result format: what the trainer records, ``packsim compare`` writes, widgets read.

One format from the live callback to ``results.json``: while training, the trainer calls
``callback(record)`` with a :class:`StepRecord` (``kind="train"`` every step, ``"eval"`` at each
evaluation); a finished run is a :class:`RunResult` whose ``curves["train"]`` / ``curves["eval"]``
are column dicts (``{"step": [...], "reported_loss": [...], ...}``) and ``final`` the last metrics;
``packsim compare`` saves a :class:`Results` as ``results.json``::

    {"runs": [{"setup": "buggy", "seed": 0, "data": "tasks", "final": {...},
               "curves": {"train": {...}, "eval": {...}}, "wall_s": ...}],
     "config": {...}, "env": {...}}

Lessons: 02, 06, 07, 09, A1, A2, A5.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packsim.core.errors import PacksimError

__all__ = ["TRAIN_KEYS", "EVAL_KEYS", "StepRecord", "RunResult", "Results", "spread"]

# Per-step columns of curves["train"].
TRAIN_KEYS = (
    "step",
    "reported_loss",  # the loss this setup's trainer reports: what a user would watch
    "response_loss",  # mean loss over response tokens (+EOS) of the same batch, in the pack
    "real_tokens",  # non-pad tokens in the step (identical across setups: same budget)
    "real_tokens_per_s",  # non-pad tokens / s of the step
    "padded_tokens_per_s",  # all tokens (padding included) / s of the step
    "elapsed_s",  # wall time since training started (evaluation excluded)
)
# Columns of curves["eval"], one row per evaluation.
EVAL_KEYS = (
    "step",
    "isolated_exact_match",  # greedy decoding, each held-out example run alone
    "isolated_response_loss",  # response-only loss, each example alone
    "packed_exact_match",  # the same examples inside packs under the training setup
    "packed_response_loss",
)


@dataclass
class StepRecord:
    """One row the trainer reports live: ``kind`` is ``"train"`` or ``"eval"``; ``values`` by key."""

    kind: str
    setup: str
    seed: int
    step: int
    values: dict[str, float]


@dataclass
class RunResult:
    """One training run: a setup, a seed, its curves and final metrics."""

    setup: str
    seed: int
    data: str = "tasks"
    curves: dict[str, dict[str, list]] = field(
        default_factory=lambda: {"train": {k: [] for k in TRAIN_KEYS}, "eval": {k: [] for k in EVAL_KEYS}}
    )
    final: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    extra: dict = field(default_factory=dict)

    def add(self, record: StepRecord) -> None:
        """Append a live record to the matching curve (unknown keys get their own column)."""
        cols = self.curves.setdefault(record.kind, {})
        n = len(cols.get("step", []))
        for key, value in {"step": record.step, **record.values}.items():
            cols.setdefault(key, [None] * n).append(value)
        for col in cols.values():  # keys missing from this record stay aligned
            if len(col) == n:
                col.append(None)

    def last(self, kind: str, key: str):
        """The last recorded value of ``curves[kind][key]`` (None if never recorded)."""
        col = [v for v in self.curves.get(kind, {}).get(key, []) if v is not None]
        return col[-1] if col else None


@dataclass
class Results:
    """Runs of ``packsim compare`` plus the config and environment that made them.

    ``throughput`` holds the packed-vs-padded measurement on the long-tailed length mix
    (``{setup: {"real_tokens_per_s": ..., ...}}``), ``wall_s`` the whole comparison's wall time.

    Example::

        >>> from packsim import Results
        >>> from packsim.core import repo_path
        >>> full = Results.load(repo_path("results/tasks-full"))  # the committed comparison
        >>> full.config["seeds"], sorted(full.summary("isolated_exact_match"))
        ([0, 1, 2], ['buggy', 'correct', 'loss_fix', 'mask_fix', 'padded'])
    """

    runs: list[RunResult] = field(default_factory=list)
    config: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    throughput: dict = field(default_factory=dict)
    wall_s: float = 0.0

    def to_dict(self) -> dict:
        return {
            "runs": [asdict(r) for r in self.runs],
            "config": self.config,
            "env": self.env,
            "throughput": self.throughput,
            "wall_s": self.wall_s,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Results:
        if not isinstance(d, dict) or not isinstance(d.get("runs"), list):
            raise PacksimError("not a packsim results object: expected a dict with a 'runs' list.")
        return cls(
            [RunResult(**r) for r in d["runs"]],
            d.get("config", {}),
            d.get("env", {}),
            d.get("throughput", {}),
            d.get("wall_s", 0.0),
        )

    def save(self, path: str | Path) -> Path:
        """Write JSON (floats kept to 6 significant digits: curves stay small enough to commit)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_compact(self.to_dict()), indent=1))
        return path

    @classmethod
    def load(cls, path: str | Path) -> Results:
        path = Path(path)
        if path.is_dir() or path.suffix != ".json":
            path = path / "results.json"
        if not path.exists():
            raise PacksimError(f"no results at {path}: run `packsim compare --out {path.parent}` first.")
        return cls.from_dict(json.loads(path.read_text()))

    def setups(self) -> list[str]:
        """Setup names in first-seen order."""
        return list(dict.fromkeys(r.setup for r in self.runs))

    def by_setup(self, data: str | None = None) -> dict[str, list[RunResult]]:
        out: dict[str, list[RunResult]] = {}
        for r in self.runs:
            if data is None or r.data == data:
                out.setdefault(r.setup, []).append(r)
        return out

    def summary(self, metric: str, data: str | None = None) -> dict[str, dict[str, float]]:
        """``{setup: {"mean", "min", "max", "std", "n"}}`` of ``final[metric]`` over seeds."""
        return {
            s: spread([r.final[metric] for r in runs if metric in r.final])
            for s, runs in self.by_setup(data).items()
        }


def _compact(obj):
    if isinstance(obj, float):
        return float(f"{obj:.6g}")
    if isinstance(obj, dict):
        return {k: _compact(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_compact(v) for v in obj]
    return obj


def spread(values: list[float]) -> dict[str, float]:
    """Mean, min, max, sample std and count of ``values`` (std 0 for one value)."""
    if not values:
        return {"mean": float("nan"), "min": float("nan"), "max": float("nan"), "std": 0.0, "n": 0}
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values), "std": std, "n": len(values)}
