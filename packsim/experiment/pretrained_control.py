"""The weights evidence with its limit: lesson 07's forensics when both models start from a pretrained base.

Lesson 07 flags a suspect whose pack gap (:mod:`packsim.experiment.forensics`: response loss inside
a causal pack minus alone) is below half its control's. Its control, the committed ``correct``
model, was trained from scratch on task examples of at most 25 tokens in rows of 256: it never saw
a longer context or a foreign prefix, so any prefix throws it off. Real bases are pretrained on
long causal packs (documents concatenated under one causal mask): they have learned to read past
a foreign prefix before any fine-tuning. This module runs that case on the same tiny Llama:

1. **pretrain a base**: ``pretrain_steps`` steps on documents wrapped into rows of ``capacity``
   tokens under one causal mask, positions continuing, every token in the loss (setup ``buggy``:
   what pretraining on causal packs does). The corpus: half examples of the four fine-tuning tasks
   (another seed's stream, no held-out prompt), half long ``copy`` documents (lengths long-tailed,
   median 90, up to ``capacity`` tokens). (A base pretrained on copy documents alone never sees the
   digits and the tasks' symbols; fine-tuned, it reached 7% isolated exact match against 81% from
   scratch, so it makes no fair control: ``corpus="copy"`` reruns it);
2. **fine-tune two copies** on the committed runs' own stream (``make_dataset(seed=0)``, the same
   :class:`~packsim.experiment.training.TrainConfig`: 600 steps of 224 examples, rows of 256, BFD):
   ``correct`` (the control) and ``buggy`` (the suspect); the same pair from a fresh init too
   (``scratch``: the committed models' recipe rerun beside the pretrained pair; close to the
   committed checkpoints, not them bit for bit);
3. every ``eval_every`` fine-tuning steps, measure each model's pack gap on lesson 07's samples
   (the stream's first 128 and 256 examples, rows of ``capacity``) and its isolated exact match.

``python -m packsim.experiment.pretrained_control --out results/pretrained-control`` writes
``results.json`` (the command, date, versions, config, the longest example of each stream next to
the capacity, the curves) and the two fine-tuned models as ``<setup>-seed0.safetensors`` (the
base too, ``base-seed0.safetensors``). :func:`load_pretrained_control` reads the committed run;
:func:`load_finetuned` a model. Shapes: per-example losses (N,); models as
:func:`packsim.core.model.build_model` makes them.

Lessons: 07.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from packsim.core.data import make_dataset, make_long_tailed_examples
from packsim.core.errors import PacksimError
from packsim.core.model import build_model
from packsim.core.paths import repo_path
from packsim.experiment.comparison import environment
from packsim.experiment.evaluation import evaluate_isolated
from packsim.experiment.forensics import measure
from packsim.experiment.model_files import load_weights, save_weights
from packsim.experiment.training import TrainConfig, train

__all__ = ["COMMITTED", "ControlConfig", "fast_config", "run_pretrained_control", "load_pretrained_control",
           "load_finetuned", "main"]

COMMITTED = "results/pretrained-control"
COMMAND = "python -m packsim.experiment.pretrained_control --out results/pretrained-control"
SETUPS = ("correct", "buggy")  # the control, then the suspect
STARTS = ("pretrained", "scratch")  # fine-tuned from the base; from a fresh init (the committed recipe)


@dataclass(frozen=True)
class ControlConfig:
    """The base's pretraining and the fine-tuning (the committed runs' recipe), and what is measured."""

    pretrain_steps: int = 2000
    docs_per_step: int = 56  # half task examples (~18 tokens), half copy documents (~110): ~3.6k tokens a step
    doc_median: float = 90
    corpus: str = "tasks+copy"
    finetune: TrainConfig = field(default_factory=TrainConfig)  # 600 x 224, rows of 256, bfd, lr 2e-3
    samples: tuple[int, ...] = (128, 256)  # lesson 07's forensics samples (fast mode, full mode)
    n_test: int = 512
    eval_every: int = 100
    seed: int = 0
    model_size: str = "tiny"

    def as_dict(self) -> dict:
        return asdict(self)


def fast_config() -> ControlConfig:
    """A run of seconds with the same code path (the tests' and ``--fast``'s)."""
    return ControlConfig(pretrain_steps=4, docs_per_step=8, finetune=TrainConfig(steps=4, examples_per_step=24,
                         warmup_steps=1, eval_every=0), samples=(16,), n_test=16, eval_every=2)


def _docs(cfg: ControlConfig) -> list:
    """The pretraining documents, at most one row long, in a seeded order: ``"tasks+copy"``, half
    examples of the four fine-tuning tasks (another seed's stream; make_dataset keeps its held-out
    prompts out of every stream) and half long ``copy`` documents; ``"copy"``, copy documents only
    (a base that never sees digits or the tasks' symbols: it fine-tunes poorly, see the module doc)."""
    cap = cfg.finetune.capacity
    n = cfg.pretrain_steps * cfg.docs_per_step
    if cfg.corpus == "copy":
        return make_long_tailed_examples(n, seed=cfg.seed + 1000, median=cfg.doc_median, max_len=cap)
    if cfg.corpus != "tasks+copy":
        raise PacksimError(f"unknown corpus {cfg.corpus!r}: use 'tasks+copy' or 'copy'.")
    docs = make_dataset(n // 2, 0, seed=cfg.seed + 1000)[0]
    docs += make_long_tailed_examples(n - n // 2, seed=cfg.seed + 1000, median=cfg.doc_median, max_len=cap)
    random.Random(cfg.seed).shuffle(docs)
    return docs


def _longest(examples) -> int:
    return max(len(ex.tokens) for ex in examples)


def _evidence(model, train_ex, test, cfg: ControlConfig) -> dict:
    """Pack gap per sample size (the forensics' numbers) and isolated exact match on ``test``."""
    out = {"isolated_exact_match": evaluate_isolated(model, test)["exact_match"]}
    for n in cfg.samples:
        e = measure(model, train_ex[:n], capacity=cfg.finetune.capacity)
        out[f"pack_gap_{n}"] = e.pack_gap
        out[f"neighbour_influence_{n}"] = e.neighbour_influence
        out[f"n_{n}"] = e.n
    model.train()
    return out


def run_pretrained_control(cfg: ControlConfig | None = None, out: str | Path | None = None,
                           progress: bool = True) -> dict:
    """Pretrain the base, fine-tune it ``correct`` and ``buggy``, measure; write ``out`` if given.

    Returns the results dict (what ``results.json`` holds)."""
    cfg = cfg or ControlConfig()
    start = time.perf_counter()
    ft = cfg.finetune
    docs = _docs(cfg)
    train_ex, test = make_dataset(ft.steps * ft.examples_per_step, cfg.n_test, seed=cfg.seed)
    base = build_model(cfg.model_size, seed=cfg.seed)
    pre_cfg = replace(ft, steps=cfg.pretrain_steps, examples_per_step=cfg.docs_per_step, strategy="wrapped",
                      eval_every=0)
    pre = train(base, docs, "buggy", pre_cfg, seed=cfg.seed, progress=progress)
    results = {
        "command": COMMAND, "config": cfg.as_dict(), "env": environment(torch.device("cpu")),
        "capacity": ft.capacity,
        "longest": {"pretraining_document": _longest(docs), "finetuning_example": _longest(train_ex)},
        "pretrain": {"final_loss": pre.final["reported_loss"], "train_time_s": pre.final["train_time_s"],
                     "tokens": int(sum(pre.curves["train"]["real_tokens"]))},
        "base": _evidence(base, train_ex, test, cfg),
        "runs": {},
    }
    models = {}
    for start_from in STARTS:
        results["runs"][start_from] = {}
        for setup in SETUPS:
            model = build_model(cfg.model_size, seed=cfg.seed)  # "scratch": the committed runs' init
            if start_from == "pretrained":
                model.load_state_dict(base.state_dict())
            curve: list[dict] = []

            def evaluate(m, step, curve=curve) -> dict:
                if step % cfg.eval_every == 0 or step == ft.steps:
                    curve.append({"step": step, **_evidence(m, train_ex, test, cfg)})
                return {}

            run = train(model, train_ex, setup, replace(ft, eval_every=min(cfg.eval_every, ft.steps)),
                        seed=cfg.seed, evaluate=evaluate, progress=progress)
            results["runs"][start_from][setup] = {"curve": curve, "final_loss": run.final["reported_loss"],
                                                  "train_time_s": run.final["train_time_s"]}
            if start_from == "pretrained":
                models[setup] = model
    results["wall_s"] = time.perf_counter() - start
    if out is not None:
        _write(results, models, base, Path(out))
    return results


def _write(results: dict, models: dict, base, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    meta = {"command": COMMAND, "date": results["env"]["date"]}
    save_weights(base, out / "base-seed0.safetensors", metadata={**meta, "setup": "base"})
    for setup, model in models.items():
        save_weights(model, out / f"{setup}-seed0.safetensors", metadata={**meta, "setup": setup})


def load_pretrained_control(folder: str | Path | None = None) -> dict:
    """The results of a run (default: the committed one, :data:`COMMITTED`)."""
    path = (repo_path(COMMITTED) if folder is None else Path(folder)) / "results.json"
    if not path.exists():
        raise PacksimError(f"no results at {path}: run `{COMMAND}` (minutes on a CPU; the file records its time).")
    return json.loads(path.read_text())


def load_finetuned(setup: str, folder: str | Path | None = None):
    """A model of the run: ``"correct"`` (the control), ``"buggy"`` (the suspect) or ``"base"``, in eval mode."""
    if setup not in (*SETUPS, "base"):
        raise PacksimError(f"no {setup!r} model in the pretrained-control run: choose correct, buggy or base.")
    folder = repo_path(COMMITTED) if folder is None else Path(folder)
    return load_weights(folder / f"{setup}-seed0.safetensors", "tiny", device="cpu")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packsim.experiment.pretrained_control",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=COMMITTED, help="folder for results.json and the models")
    parser.add_argument("--fast", action="store_true", help="a run of seconds (checks the code path)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    res = run_pretrained_control(fast_config() if args.fast else ControlConfig(), out=args.out)
    for start_from, setup in ((a, b) for a in STARTS for b in SETUPS):
        last = res["runs"][start_from][setup]["curve"][-1]
        print(start_from, setup, {k: round(v, 4) if isinstance(v, float) else v for k, v in last.items()})
    print(f"wrote {args.out} in {res['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
