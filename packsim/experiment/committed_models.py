"""The trained tiny models the course commits, so a lesson can show *trained* attention in fast mode.

Fast mode trains for seconds, and a model that has trained for seconds attends almost uniformly:
its attention says little about what a trained model does with its neighbours. The repository
therefore commits the ``buggy`` and ``correct`` models of one full-mode run of the tasks design
(``packsim compare`` full budget: 600 steps of 224 examples, rows of 256 tokens, seed 0), as
safetensors files under ``results/tasks-full/models-committed/<setup>-seed0.safetensors``.

Each file holds the ``state_dict`` of a tiny ``LlamaForCausalLM`` (~0.53M float32 parameters,
~2 MB; the tied ``lm_head`` is stored once) and, in its safetensors metadata, what the run
measured on that model: ``isolated_exact_match`` (the 512 held-out examples of
``make_dataset(..., seed=0)``, each scored alone) and ``outside_attention_share`` (mean over
layers, heads and real tokens of 64 of them packed into rows of 256), plus the command and the
versions that produced it. ``tests/test_committed_models.py`` rescores both from the files. The
run is a rerun of ``results/tasks-full``'s seed 0 and lands close to it, not on it (each file's
metadata and ``results/tasks-full/results.json`` hold the two scores).

How the files were made (``runs/`` is not committed)::

    packsim compare --setups buggy,correct --seeds 1 --out runs/trained
    python -c "from packsim.experiment.committed_models import export_committed; export_committed('runs/trained')"

Lessons: 02, 06, 07, 09, A2, A6, A8.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import safe_open

from packsim.core.errors import PacksimError
from packsim.core.paths import repo_path
from packsim.experiment.model_files import load_weights, model_path, save_weights
from packsim.experiment.results import Results

__all__ = ["COMMITTED_DIR", "COMMITTED_SETUPS", "committed_path", "committed_metadata",
           "load_committed_model", "export_committed"]

COMMITTED_DIR = "results/tasks-full/models-committed"
COMMITTED_SETUPS = ("buggy", "correct")
COMMAND = "packsim compare --setups buggy,correct --seeds 1 --out runs/trained"
_RECORDED = ("isolated_exact_match", "outside_attention_share", "reported_loss", "response_loss")


def _check_setup(setup: str) -> None:
    if setup not in COMMITTED_SETUPS:
        raise PacksimError(
            f"no committed model for setup {setup!r}: the repository commits {list(COMMITTED_SETUPS)}; "
            f"train others with `packsim compare --setups {setup} --out DIR` and load_model(DIR, {setup!r})."
        )


def committed_path(setup: str, seed: int = 0, folder: str | Path | None = None) -> Path:
    """The committed ``setup`` model file: in ``folder``, or by default in :data:`COMMITTED_DIR`
    (found with :func:`packsim.core.paths.repo_path`, whatever the working directory)."""
    _check_setup(setup)
    name = f"{setup}-seed{seed}.safetensors"
    if folder is None:
        return repo_path(f"{COMMITTED_DIR}/{name}")
    path = Path(folder) / name
    if not path.exists():
        raise PacksimError(f"no committed model at {path}: write it with export_committed(RUN_DIR, dest={str(folder)!r}).")
    return path


def committed_metadata(setup: str, seed: int = 0, folder: str | Path | None = None) -> dict:
    """The file's metadata: its config and the scores its run recorded (numbers as int / float)."""
    with safe_open(str(committed_path(setup, seed, folder)), framework="pt") as f:
        meta = dict(f.metadata() or {})
    for key in _RECORDED:
        meta[key] = float(meta[key])
    for key in ("steps", "examples_per_step", "capacity", "n_test", "seed"):
        meta[key] = int(meta[key])
    return meta


def load_committed_model(setup: str, seed: int = 0, device=None, folder: str | Path | None = None):
    """The committed trained ``setup`` model (``"buggy"`` or ``"correct"``), in eval mode.

    Example::

        >>> from packsim import load_committed_model
        >>> model = load_committed_model("correct")
        >>> type(model).__name__, model.training
        ('LlamaForCausalLM', False)
    """
    path = committed_path(setup, seed, folder)
    return load_weights(path, committed_metadata(setup, seed, folder)["model_size"], device)


def export_committed(out: str | Path, setups=COMMITTED_SETUPS, seed: int = 0, dest: str | Path | None = None) -> list[Path]:
    """Save the models of a ``packsim compare`` run (``out``) as the committed safetensors files.

    ``out`` must hold ``results.json`` and ``models/<setup>-seed<k>.pt`` (full mode, tasks design).
    ``dest`` defaults to :data:`COMMITTED_DIR` in the repository.
    """
    out = Path(out)
    results = Results.load(out / "results.json")
    if results.config.get("data") != "tasks" or results.config.get("mode") != "full":
        raise PacksimError(
            f"{out} is a {results.config.get('data')}/{results.config.get('mode')} run: the committed "
            f"models come from the tasks design in full mode (`{COMMAND}`)."
        )
    dest = Path(dest) if dest is not None else repo_path("results/tasks-full") / "models-committed"
    dest.mkdir(parents=True, exist_ok=True)
    train_cfg = results.config["train"]
    written = []
    for setup in setups:
        _check_setup(setup)
        run = next((r for r in results.runs if r.setup == setup and r.seed == seed), None)
        pt = model_path(out, setup, seed)
        if run is None or not pt.exists():
            raise PacksimError(f"{out} has no {setup} seed {seed} run with saved weights ({pt}).")
        model = load_weights(pt, results.config.get("model_size", "tiny"), device="cpu")
        meta = {
            "setup": setup, "seed": str(seed), "data": "tasks", "mode": "full",
            "model_size": results.config.get("model_size", "tiny"),
            "steps": str(train_cfg["steps"]), "examples_per_step": str(train_cfg["examples_per_step"]),
            "capacity": str(train_cfg["capacity"]), "n_test": str(results.config["n_test"]),
            "command": COMMAND, "env": json.dumps(results.env, sort_keys=True),
            **{k: repr(float(run.final[k])) for k in _RECORDED},
        }
        written.append(save_weights(model, dest / f"{setup}-seed{seed}.safetensors", metadata=meta))
    return written
