"""The comparison: train the same tiny model under several setups, side by side (notebook 06).

Every run of a comparison shares the model init, the examples, their order, the token budget and
the optimiser; only the setup differs. Two data designs:

- ``tasks`` (default): i.i.d. synthetic tasks (reverse, add, sort, key-value). The mask is the
  dominant fix: attention spread over unrelated examples makes the tasks harder to learn.
- ``facts``: synthetic facts, each question three times in a row (:mod:`packsim.experiment.paraphrased_facts`). Under
  the buggy setup the later copies read the answer off the first: its reported loss ends *below*
  the correct setup's while it answers far fewer questions alone. The loss curve lies.

Outputs ``DIR/results.json`` (:class:`~packsim.experiment.results.Results`), ``DIR/report.html``
(:mod:`packsim.viz.comparison_report`; skipped, with one printed line, where plotly is not installed:
the runs need no plotly) and, per run, the trained weights ``DIR/models/<setup>-seed<k>.pt``
(:func:`load_model`), which the leakage explorer can show. ``packsim compare`` is its command
line (:mod:`packsim.commands.compare`).

Lessons: 06, A5.
"""

from __future__ import annotations

import multiprocessing
import os
import platform
import random
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from queue import Empty

import torch
from tqdm.auto import tqdm

from packsim.core.attention_share import mean_outside_share
from packsim.core.batch import PackedBatch
from packsim.core.data import make_dataset
from packsim.core.device import get_device, model_device
from packsim.core.errors import PacksimError
from packsim.core.model import attention_maps, build_model
from packsim.core.setups import get_setup
from packsim.experiment.data_designs import COMPARE_DESIGNS
from packsim.experiment.evaluation import evaluate_isolated, evaluate_packed, held_out_metrics
from packsim.experiment.model_files import load_weights, model_path, save_weights
from packsim.experiment.paraphrased_facts import make_facts
from packsim.experiment.results import Results, RunResult, StepRecord
from packsim.experiment.run_mode import fast_mode
from packsim.experiment.throughput import measure_throughput
from packsim.experiment.training import TrainConfig, train

__all__ = ["ExperimentConfig", "experiment_config", "run_comparison", "load_model"]

DEFAULT_SETUPS = {
    "full": ("buggy", "correct", "mask_fix", "loss_fix", "padded"),
    "fast": ("buggy", "correct"),
}


@dataclass
class ExperimentConfig:
    """What ``packsim compare`` runs: a design, setups x seeds, one TrainConfig for all of them."""

    data: str = "tasks"
    mode: str = "full"
    setups: list[str] = field(default_factory=lambda: list(DEFAULT_SETUPS["full"]))
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    train: TrainConfig = field(default_factory=TrainConfig)
    model_size: str = "tiny"
    n_test: int = 512
    # facts design only. 225 entities x 3 copies: measured so that, at the full budget, correct has
    # memorised part of the facts while buggy's reported loss is still lower (README, "Measured").
    n_entities: int = 225
    copies: int = 3  # copies of each question side by side in the stream (1: no duplicates)
    throughput_steps: int = 8  # long-tailed packed-vs-padded measurement, per setup (0: skip)

    def as_dict(self) -> dict:
        return asdict(self)


def experiment_config(data: str = "tasks", fast: bool | None = None, **overrides) -> ExperimentConfig:
    """The course's budgets: ``fast`` (notebook / CI: buggy vs correct, one seed, 220 steps) or ``full``.

    ``fast=None`` follows ``PACKSIM_FAST``. ``overrides`` replace ExperimentConfig fields, or
    TrainConfig fields (``steps=``, ``examples_per_step=``, ``eval_every=`` ...).
    """
    if data not in COMPARE_DESIGNS:
        raise PacksimError(f"unknown data design {data!r}: use one of {list(COMPARE_DESIGNS)}.")
    fast = fast_mode() if fast is None else fast
    mode = "fast" if fast else "full"
    train_cfg = TrainConfig(strategy="sequential" if data == "facts" else "bfd")
    cfg = ExperimentConfig(data=data, mode=mode, setups=list(DEFAULT_SETUPS[mode]), train=train_cfg)
    if fast:
        cfg.seeds = [0]
        cfg.n_test = 256
        cfg.throughput_steps = 1
        # sized to lesson 06's time budget (tests/test_notebooks.py times it; the README's course table
        # has the minutes) with buggy and correct still apart (the notebook prints the gap)
        cfg.train = replace(cfg.train, steps=220, eval_every=55)
    train_fields = set(TrainConfig.__dataclass_fields__)
    cfg.train = replace(cfg.train, **{k: v for k, v in overrides.items() if k in train_fields})
    for key, value in overrides.items():
        if key not in train_fields:
            if key not in ExperimentConfig.__dataclass_fields__:
                raise PacksimError(f"unknown experiment option {key!r}.")
            setattr(cfg, key, value)
    for s in cfg.setups:
        get_setup(s)  # fail early on a typo, before any training
    if cfg.n_entities < 1 or cfg.copies < 1:
        raise PacksimError(
            f"the facts design needs n_entities >= 1 and copies >= 1, got {cfg.n_entities} and "
            f"{cfg.copies}: e.g. --entities 225 --copies 3 (copies 1 is the no-duplicates control)."
        )
    return cfg


# --- data designs -----------------------------------------------------------------------------


@dataclass
class DesignData:
    """Examples of one design and seed: the training stream, test sets, and a probe of train packs."""

    train: list
    tests: dict[str, list]  # name -> held-out examples, scored alone
    groups: list[str] | None = None  # per training example (facts: "first" / "repeat")


def _sample(examples: list, n: int, seed: int) -> list:
    if len(examples) <= n:
        return list(examples)
    return random.Random(seed).sample(examples, n)


def design_data(cfg: ExperimentConfig, seed: int) -> DesignData:
    n_train = cfg.train.steps * cfg.train.examples_per_step
    if cfg.data == "tasks":
        train_ex, test = make_dataset(n_train, cfg.n_test, seed=seed)
        return DesignData(train_ex, {"isolated": test})
    facts = make_facts(cfg.n_entities, n_train, seed=seed, copies=cfg.copies)
    return DesignData(
        facts.train,
        {
            "isolated": _sample(facts.test_seen, cfg.n_test, seed),
            "heldout": _sample(facts.test_heldout, cfg.n_test, seed),
        },
        ["repeat" if r else "first" for r in facts.is_repeat],
    )


# --- one run ----------------------------------------------------------------------------------


def _evaluator(data: DesignData, setup, cfg: ExperimentConfig) -> Callable:
    """``evaluate(model, step)``: isolated scores of each test set, plus the main set in packs."""

    def evaluate(model, step: int) -> dict:
        out = held_out_metrics(model, data.tests["isolated"], setup, cfg.train.capacity)
        for name, examples in data.tests.items():
            if name != "isolated":
                out[f"{name}_exact_match"] = evaluate_isolated(model, examples)["exact_match"]
        return out

    return evaluate


def _train_probe(model, data: DesignData, setup, cfg: ExperimentConfig) -> dict:
    """The last two steps' training examples, in their training packs vs alone (the warning sign)."""
    n = 2 * cfg.train.examples_per_step
    end = cfg.train.steps * cfg.train.examples_per_step
    probe = data.train[end - n : end]
    packed = evaluate_packed(model, probe, setup, cfg.train.capacity, strategy=cfg.train.strategy)
    alone = evaluate_isolated(model, probe)
    return {
        "train_packed_response_loss": packed["response_loss"],
        "train_isolated_response_loss": alone["response_loss"],
        "train_packed_exact_match": packed["exact_match"],
        "train_isolated_exact_match": alone["exact_match"],
    }


def _outside_attention(model, data: DesignData, setup, cfg: ExperimentConfig) -> float:
    """Mean share of attention a real token of a test pack gives to other examples (all layers)."""
    examples = data.tests["isolated"][:64]
    batch = PackedBatch.from_examples(examples, cfg.train.capacity, setup=setup, strategy="sequential")
    batch = batch.to(model_device(model))
    return mean_outside_share(attention_maps(model, batch), batch.seq_ids)  # over (L, B, H, real T)


def run_one(cfg: ExperimentConfig, setup_name: str, seed: int, data: DesignData, device,
            callback=None, progress=True) -> tuple[RunResult, torch.nn.Module]:
    """Train one setup x seed and fill its final metrics; returns the run and the trained model."""
    setup = get_setup(setup_name)
    model = build_model(cfg.model_size, seed=seed).to(device)
    run = train(model, data.train, setup, cfg.train, seed=seed, evaluate=_evaluator(data, setup, cfg),
                callback=callback, groups=data.groups, data=cfg.data, progress=progress)
    run.setup = setup_name
    run.final.update(_train_probe(model, data, setup, cfg))
    run.final["outside_attention_share"] = _outside_attention(model, data, setup, cfg)
    run.final["isolated_exact_match_by_task"] = evaluate_isolated(model, data.tests["isolated"])["exact_match_by_task"]
    return run, model


# --- the comparison ---------------------------------------------------------------------------


def environment(device) -> dict:
    """Versions, device and machine of a run (written into results.json)."""
    import transformers

    from packsim.core.version import __version__

    env = {
        "packsim": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    return env


def default_jobs(n_runs: int, device) -> int:
    """Parallel runs: one per CPU core on CPU (one thread each), one on CUDA.

    A tiny model uses two threads poorly, and a torch process with two threads on a core that is
    also busy with anything else slows down many times over; two one-thread runs side by side
    are both faster in total and steady.
    """
    if torch.device(device).type != "cpu":
        return 1
    return max(1, min(n_runs, os.cpu_count() or 1))


def run_comparison(cfg: ExperimentConfig, device=None, out: str | Path | None = None,
                   callback: Callable[[StepRecord], None] | None = None, progress: bool = True,
                   jobs: int | None = None) -> Results:
    """Run every setup x seed of ``cfg``; save ``results.json`` and the models under ``out`` if given.

    ``report.html`` is the command's (:mod:`packsim.commands.compare`) or yours:
    ``packsim.viz.comparison_report.write_report(results, path)``.

    ``jobs`` runs in parallel processes (default :func:`default_jobs`); ``callback`` still gets
    every record live, in this process. ``jobs=1`` trains in this process.
    """
    device = get_device(device)
    start = time.perf_counter()
    results = Results(config=cfg.as_dict(), env=environment(device))
    out = Path(out) if out is not None else None
    tasks = [(name, seed) for seed in cfg.seeds for name in cfg.setups]
    jobs = jobs or default_jobs(len(tasks), device)
    results.env["parallel_runs"] = jobs
    if jobs == 1:
        runs = [_run_and_save(cfg, name, seed, str(device), out, callback, progress) for name, seed in tasks]
    else:
        runs = _run_parallel(cfg, tasks, str(device), out, callback, progress, jobs)
    results.runs = runs
    pair = ["padded", "correct"] + (["buggy"] if "buggy" in cfg.setups else [])
    threads = torch.get_num_threads()
    torch.set_num_threads(_threads_per_job(jobs))  # measured like the runs: one lane's threads
    try:
        results.throughput = measure_throughput(pair, cfg.throughput_steps, device)
    finally:
        torch.set_num_threads(threads)
    results.wall_s = time.perf_counter() - start
    if out is not None:
        results.save(out / "results.json")
    return results


def _run_and_save(cfg, name, seed, device, out, callback, progress) -> RunResult:
    run, model = run_one(cfg, name, seed, design_data(cfg, seed), torch.device(device), callback, progress)
    if out is not None:
        save_model(model, out, name, seed)
    if progress:
        print(_run_line(run), flush=True)
    return run


def _worker(cfg, name, seed, device, out, queue, threads) -> RunResult:
    """One run in a child process; live records go back through ``queue``."""
    torch.set_num_threads(threads)
    return _run_and_save(cfg, name, seed, device, out, queue.put if queue is not None else None, False)


def _threads_per_job(jobs: int) -> int:
    return max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 else torch.get_num_threads()


def _run_parallel(cfg, tasks, device, out, callback, progress, jobs) -> list[RunResult]:
    threads = _threads_per_job(jobs)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager, ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
        queue = manager.Queue() if callback is not None else None
        futures = [pool.submit(_worker, cfg, n, s, device, out, queue, threads) for n, s in tasks]
        bar = tqdm(total=len(futures), desc=f"runs ({jobs} in parallel)", disable=not progress)
        done: set = set()
        while len(done) < len(futures):
            _drain(queue, callback, timeout=0.2)
            for f in futures:
                if f not in done and f.done():
                    done.add(f)
                    bar.update()
                    if progress:
                        bar.write(_run_line(f.result()))
        _drain(queue, callback, timeout=0)
        bar.close()
        return [f.result() for f in futures]


def _drain(queue, callback, timeout: float) -> None:
    """Pass every record waiting in ``queue`` to ``callback`` (sleep ``timeout`` if none)."""
    if queue is None:
        time.sleep(timeout)
        return
    try:
        record = queue.get(timeout=timeout) if timeout else queue.get_nowait()
        while True:
            callback(record)
            record = queue.get_nowait()
    except Empty:
        pass


def _run_line(run: RunResult) -> str:
    f = run.final
    return (f"{run.setup:>10} seed {run.seed}: isolated exact match {f['isolated_exact_match']:.3f}, "
            f"reported loss {f['reported_loss']:.3f}, {f['real_tokens_per_s']:,.0f} real tok/s, "
            f"{run.wall_s:.0f} s")


def save_model(model, out: Path, setup: str, seed: int) -> Path:
    return save_weights(model, model_path(out, setup, seed))


def load_model(out: str | Path, setup: str, seed: int = 0, device=None):
    """The model a comparison trained (``DIR/models/<setup>-seed<k>.pt``), in eval mode."""
    path = model_path(out, setup, seed)
    if not path.exists():
        raise PacksimError(f"no trained model at {path}: run `packsim compare --out {out}` first.")
    results = Results.load(Path(out) / "results.json")
    return load_weights(path, results.config.get("model_size", "tiny"), device)
