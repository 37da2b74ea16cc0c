"""``packsim train``: its options checked, one process or N through torchrun, and its outputs (lesson 10).

Run plainly it is one process. Launched by a real launcher it trains data-parallel, one rank per
process (:mod:`packsim.scaling.data_parallel` is the step each rank runs; ``accelerate launch
--cpu --num_processes 2`` has started ONE process: accelerate's simple launcher used
``--num_processes`` only for mpirun, the accelerate version it was seen on is in the README's
"Data-parallel training"; ``--multi_gpu`` goes through torch.distributed.run, gloo when there is no
GPU)::

    packsim train --steps 20 --out runs/one                                 # one process
    python -m torch.distributed.run --standalone --nproc_per_node 2 -m packsim train --out runs/two
    accelerate launch --multi_gpu --num_processes 2 -m packsim train --out runs/two       # gloo without a GPU
    packsim train --nproc 2 --out runs/two                                  # the same, via torchrun

Every option is checked before any process group starts (:func:`packsim.scaling.step_plan.validate`).
Rank 0 writes the output folder: ``OUT/results.json`` (the run,
:class:`~packsim.experiment.results.Results` with one :class:`~packsim.experiment.results.RunResult`),
``OUT/model.pt`` (the final weights, :mod:`packsim.experiment.model_files`) and ``OUT/losses.json``
(the loss curves at full precision; results.json keeps 6 digits): :func:`save_output`,
:func:`load_output`, and :func:`compare_outputs`, which is how lesson 10 and
``tests/test_data_parallel.py`` tell a distributed run from the one-process run. ``--engine trainer`` trains through the transformers
``Trainer`` instead (:mod:`packsim.scaling.trainer_parallel`).

Several runs at once from Python, as a notebook starts them: :func:`launch_runs` takes ``{name:
options}`` (the words ``packsim train`` takes); a run whose options hold ``--nproc N`` starts N
ranks through PyTorch's launcher (:func:`torchrun_command`), the others train in this process while
the launched ones run. Each writes ``out/<name>``, which it loads back.

Lessons: 10.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from packsim.core.device import get_device
from packsim.core.errors import PacksimError
from packsim.core.model import build_model
from packsim.core.setups import get_setup
from packsim.experiment.data_designs import make_data
from packsim.experiment.model_files import read_weights, save_weights
from packsim.experiment.results import Results, RunResult
from packsim.experiment.training import TrainConfig
from packsim.scaling.data_parallel import train_data_parallel
from packsim.scaling.launch_env import world
from packsim.scaling.step_plan import validate
from packsim.scaling.train_options import OPTIONS as _OPTIONS
from packsim.scaling.train_options import add_arguments

__all__ = ["torchrun_command", "add_arguments", "run", "main", "save_output", "load_output", "compare_outputs",
           "launch_runs"]


def torchrun_command(nproc: int, train_args: list[str]) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc_per_node N -m packsim train ARGS``."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
            "-m", "packsim", "train", *train_args]


def _train_argv(args: argparse.Namespace) -> list[str]:
    """The options of ``args`` as command-line words (``--nproc`` left out): what each rank gets."""
    argv = []
    for name in _OPTIONS:
        value = getattr(args, name, None)
        if value is not None:
            argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv + (["--quiet"] if args.quiet else [])


def _config(args: argparse.Namespace) -> TrainConfig:
    cfg = TrainConfig(steps=args.steps, examples_per_step=args.examples_per_step, capacity=args.capacity,
                      warmup_steps=min(30, max(1, args.steps // 10)), eval_every=0)
    return replace(cfg, lr=args.lr) if args.lr is not None else cfg


def _check_args(args: argparse.Namespace, n_ranks: int) -> tuple[TrainConfig, list]:
    """Config and the example stream, every option checked for ``n_ranks`` processes."""
    args.normalise = str(args.normalise).strip().lower()
    if args.engine not in ("packsim", "trainer"):
        raise PacksimError(f"unknown --engine {args.engine!r}: use packsim or trainer.")
    get_setup(args.setup)
    cfg = _config(args)
    if cfg.capacity < 16:
        raise PacksimError(f"--capacity {cfg.capacity} is too small: use at least 16 tokens per pack.")
    examples = make_data(args.data, max(cfg.steps, 1) * max(cfg.examples_per_step, 1), args.seed, cfg.capacity)
    validate(len(examples), cfg, n_ranks, args.grad_accum, args.normalise, args.balance, examples)
    if args.engine == "trainer":
        from packsim.scaling.trainer_parallel import check_trainer_args

        check_trainer_args(cfg, n_ranks, args.grad_accum, args.balance)
    return cfg, examples


def _device(name: str | None, world_size: int, local_rank: int) -> torch.device:
    device = get_device(name)
    if device.type == "cuda" and world_size > 1:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    return device


def run(args: argparse.Namespace) -> int:
    rank, world_size, local_rank = world()
    if args.nproc is not None:
        if world_size > 1:
            raise PacksimError("--nproc launches torchrun itself: drop it when you start packsim under a launcher.")
        _check_args(args, args.nproc)  # fails here, in one line, before any process starts
        return subprocess.run(torchrun_command(args.nproc, _train_argv(args)), check=False).returncode
    cfg, examples = _check_args(args, world_size)
    device = _device(args.device, world_size, local_rank)
    model = build_model(args.model_size, seed=args.seed).to(device)
    say = print if rank == 0 and not args.quiet else (lambda *a, **k: None)
    say(f"packsim train: {args.setup}, {args.engine} engine, {world_size} process(es) x {args.grad_accum} "
        f"micro-batch(es), {cfg.steps} steps x {cfg.examples_per_step} examples, normalise {args.normalise}",
        flush=True)
    if args.engine == "trainer":
        from packsim.scaling.trainer_parallel import train_with_trainer

        result = train_with_trainer(model, examples, args.setup, cfg, args.seed, args.grad_accum, args.normalise,
                                    args.data, args.quiet)
    else:
        created = world_size > 1 and not dist.is_initialized()
        if created:
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        try:
            result = train_data_parallel(model, examples, args.setup, cfg, args.seed, args.grad_accum,
                                         args.normalise, args.balance, data=args.data,
                                         callback=lambda r: say(f"step {r.step}: loss {r.values['reported_loss']:.4f}"))
        finally:
            if created:
                dist.destroy_process_group()
    if rank == 0:
        from packsim.experiment.comparison import environment

        config = {**cfg.as_dict(), **{k: getattr(args, k) for k in _OPTIONS if k not in ("out", "device")}}
        env = {**environment(device), "world_size": world_size,
               "distributed_backend": ("nccl" if device.type == "cuda" else "gloo") if world_size > 1 else None}
        path = save_output(result, model, args.out, config, env)
        say(f"wrote {path}, model.pt and losses.json in {result.wall_s:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``packsim train`` from Python, e.g. the one-process run of a notebook: same options, same outputs."""
    parser = argparse.ArgumentParser(prog="packsim train", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


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


def launch_runs(runs: dict[str, list[str]], out: str | Path, threads: int = 1) -> dict[str, dict]:
    """Run every ``packsim train`` run of ``runs`` (name -> options) at the same time; load their outputs.

    Options holding ``--nproc N`` start N ranks through torchrun (:func:`torchrun_command`), in
    fresh processes with ``threads`` torch threads each (``OMP_NUM_THREADS``); the other runs are
    one process: this one, with ``torch.set_num_threads(threads)`` while they run (restored after),
    so every rank and every single process computes with the same number of threads. Outputs go to
    ``out/<name>``; returns ``{name: load_output(out/<name>)}``. A failed run raises with its error.
    """
    out = Path(out)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    argvs = {name: [*options, "--out", str(out / name)] for name, options in runs.items()}
    procs, t0 = {}, time.perf_counter()
    for name, argv in argvs.items():
        if "--nproc" in argv:
            i = argv.index("--nproc")
            cmd = torchrun_command(int(argv[i + 1]), argv[:i] + argv[i + 2 :])
            print(f"{name:12} python {' '.join(cmd[1:])}", flush=True)
            log = tempfile.TemporaryFile("w+")  # a file, not a pipe: a chatty run never blocks on a full pipe
            procs[name] = (subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log, text=True), log)
    errors = {}
    for name, argv in argvs.items():
        if name not in procs:  # one process: here, while the launched runs train
            print(f"{name:12} packsim train {' '.join(argv)}   (in this process)", flush=True)
            errors.update(_train_here(name, argv, threads))
    for name, (proc, log) in procs.items():
        proc.wait()
        log.seek(0)
        if proc.returncode:
            errors[name] = f"exit {proc.returncode}: {log.read()[-1500:]}"
        log.close()
    if errors:
        name, why = next(iter(errors.items()))
        raise PacksimError(f"packsim train run {name!r} failed ({why})")
    print(f"{len(runs)} run(s) finished in {time.perf_counter() - t0:.0f} s", flush=True)
    return {name: load_output(out / name) for name in runs}


def _train_here(name: str, argv: list[str], threads: int) -> dict[str, str]:
    """``packsim train ARGV`` in this process with ``threads`` torch threads; {name: error} if it failed."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        main([*argv, "--quiet"] if "--quiet" not in argv else argv)
    except PacksimError as err:
        return {name: str(err)}
    except SystemExit as exit_:  # argparse rejected an option (it printed why)
        return {name: f"exit {exit_.code}: bad options, see the message above"}
    finally:
        torch.set_num_threads(before)
    return {}
