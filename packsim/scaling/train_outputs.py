"""The output folder of one ``packsim train`` run: writing it, reading it, and diffing two of them.

``OUT/results.json`` (the run, :class:`~packsim.experiment.results.Results` with one
:class:`~packsim.experiment.results.RunResult`), ``OUT/model.pt`` (the final weights,
:mod:`packsim.experiment.model_files`) and ``OUT/losses.json`` (the loss curves at full precision;
results.json keeps 6 digits). Rank 0 writes them (:mod:`packsim.scaling.train_command`);
:func:`compare_outputs` is how lesson 10 and ``tests/test_data_parallel.py`` tell a distributed
run from the one-process run.

Lessons: 10.
"""

from __future__ import annotations

import json
from pathlib import Path

from packsim.core.errors import PacksimError
from packsim.experiment.model_files import read_weights, save_weights
from packsim.experiment.results import Results, RunResult

__all__ = ["save_output", "load_output", "compare_outputs"]


def save_output(run: RunResult, model, out: str | Path, config: dict, env: dict) -> Path:
    """Write results.json (one run), model.pt and losses.json (full precision) under ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    Results(runs=[run], config=config, env=env, wall_s=run.wall_s).save(out / "results.json")
    save_weights(model, out / "model.pt")
    train = run.curves["train"]
    exact = {k: train[k] for k in ("reported_loss", "response_loss") if k in train}
    (out / "losses.json").write_text(json.dumps(exact))
    return out / "results.json"


def load_output(out: str | Path) -> dict:
    """``{"run": RunResult, "losses": {name: [float]}, "state": state_dict}`` of a ``packsim train`` output."""
    out = Path(out)
    if not (out / "model.pt").exists():
        raise PacksimError(f"no packsim train output in {out}: run `packsim train --out {out}` first.")
    return {"run": Results.load(out / "results.json").runs[0],
            "losses": json.loads((out / "losses.json").read_text()),
            "state": read_weights(out / "model.pt")}


def compare_outputs(a: str | Path | dict, b: str | Path | dict, loss: str = "reported_loss") -> dict:
    """Max |difference| of the per-step ``loss`` and of every weight between two outputs (dirs or loaded)."""
    a = a if isinstance(a, dict) else load_output(a)
    b = b if isinstance(b, dict) else load_output(b)
    la, lb = a["losses"][loss], b["losses"][loss]
    if len(la) != len(lb) or a["state"].keys() != b["state"].keys():
        raise PacksimError("the two runs differ in steps or model: compare runs of the same --steps and model.")
    weight = max(float((a["state"][k].float() - b["state"][k].float()).abs().max()) for k in a["state"])
    return {"steps": len(la), "max_loss_diff": max(abs(x - y) for x, y in zip(la, lb, strict=True)),
            "max_weight_diff": weight}
