"""``packsim train``: one setup trained on one process or data-parallel under torchrun (lesson 10).

Run plainly it is one process. Launched by a real launcher it trains with PyTorch's
``DistributedDataParallel`` (gloo on CPU, nccl on CUDA), one rank per process (with accelerate 1.15,
``--cpu --num_processes 2`` starts ONE process: its simple launcher uses ``--num_processes`` only
for mpirun; ``--multi_gpu`` goes through torch.distributed.run, gloo when there is no GPU)::

    packsim train --steps 20 --out runs/one                                 # one process
    python -m torch.distributed.run --standalone --nproc_per_node 2 -m packsim train --out runs/two
    accelerate launch --multi_gpu --num_processes 2 -m packsim train --out runs/two       # gloo without a GPU
    packsim train --nproc 2 --out runs/two                                  # the same, via torchrun

Every rank builds the same example stream, so the global batch of each step and the order of its
examples are those of the one-process run; :mod:`packsim.experiment.sharding` splits it over ranks
and micro-batches (``--balance none``: each rank packs its own share; ``round_robin|tokens|attention``:
the step is packed once and its packs are dealt out by cost).

Before the backward passes, one all-reduce shares every micro-batch's counted targets
(an ``(R, M)`` table), and each micro-batch's summed token loss is scaled by
:func:`packsim.experiment.normalisation.backward_scales` (``--normalise global|local|mean``).
Under ``global`` the gradient, and so every weight, equals the one-process run's up to float
summation order. A micro-batch with no counted target (a rank with fewer packs than micro-batches)
still runs a forward and backward on a padding-only pack, so DDP stays in step; it contributes 0.

Outputs (rank 0): ``OUT/results.json`` (one run, :class:`~packsim.experiment.results.Results`),
``OUT/model.pt`` (final weights) and ``OUT/losses.json`` (the loss curves at full precision;
results.json keeps 6 digits). :func:`compare_outputs` diffs two runs. ``--engine trainer`` trains
the same way through the transformers ``Trainer`` instead (:mod:`packsim.experiment.trainer_parallel`).

Lessons: 10.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from packsim.core.batch import PackedBatch
from packsim.core.device import get_device, model_device
from packsim.core.errors import PacksimError
from packsim.core.loss import IGNORE_INDEX, token_losses
from packsim.core.model import build_model
from packsim.core.setups import get_setup
from packsim.experiment.normalisation import backward_scales, weights
from packsim.experiment.rank_balance import pack_costs, straggler_ratio
from packsim.experiment.results import Results, RunResult, StepRecord
from packsim.experiment.sharding import make_data, plan_step, select_rows, validate, world
from packsim.experiment.training import TrainConfig, lr_at

__all__ = ["train_data_parallel", "save_output", "load_output", "compare_outputs", "torchrun_command",
           "add_arguments", "run", "main"]

# ------------------------------------------------------------------------------ the training loop


def _empty_like(batch: PackedBatch) -> PackedBatch:
    """A one-row pack with no counted target (labels all -100): an empty micro-batch's stand-in."""
    one = select_rows(batch, [0])
    return replace(one, labels=torch.full_like(one.labels, IGNORE_INDEX))


def _forward(net, batch: PackedBatch, backend: str) -> torch.Tensor:
    """Logits (B, T, V) through ``net`` (a model or its DDP wrapper) under the batch's setup."""
    cu, max_len = batch.attention_segments()
    cu = cu.to(batch.input_ids.device)
    return net(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False, cu_seq_lens_q=cu,
               cu_seq_lens_k=cu, max_length_q=max_len, max_length_k=max_len, packsim_backend=backend).logits


def _autocast(device: torch.device):
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


def _all_reduce(t: torch.Tensor, world_size: int) -> torch.Tensor:
    if world_size > 1:
        dist.all_reduce(t)
    return t


def train_data_parallel(model, examples: list, setup="correct", cfg: TrainConfig | None = None, seed: int = 0,
                        grad_accum: int = 1, normalise: str = "global", balance: str = "none",
                        callback=None, data: str = "tasks") -> RunResult:
    """Train ``model`` in place on this rank's share of every step; returns the run (same on every rank).

    Called plainly it is the one-process run; under a launcher the process group must already be
    initialised (:func:`run` does it). See the module doc for the split and the normalisation.
    """
    cfg = cfg or TrainConfig()
    setup = get_setup(setup)
    rank, world_size, _ = world() if dist.is_initialized() else (0, 1, 0)
    validate(len(examples), cfg, world_size, grad_accum, normalise, balance)
    device = model_device(model)
    torch.manual_seed(seed)
    model.train()
    ids = [device.index] if device.type == "cuda" else None  # one device per process
    net = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids) if world_size > 1 else model
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=0.0)
    run = RunResult(setup=setup.name, seed=seed, data=data)
    E, M, R = cfg.examples_per_step, grad_accum, world_size
    elapsed, start = 0.0, time.perf_counter()
    for step in range(cfg.steps):
        t0 = time.perf_counter()
        micro, packs = plan_step(examples[step * E : (step + 1) * E], cfg, setup, R, M, balance)
        real_mb = [b is not None for b in micro[rank]]
        filler = _empty_like(next(b for b in micro[rank] if b is not None))
        mine = [(b if b is not None else filler).to(device) for b in micro[rank]]  # (B_m, T) each
        counts = torch.tensor([float((b.labels[:, 1:] != IGNORE_INDEX).sum()) for b in mine], dtype=torch.float64)
        table = torch.zeros(R, M, dtype=torch.float64, device=device)  # nccl reduces device tensors only
        table[rank] = counts.to(device)
        table = _all_reduce(table, R).cpu()  # (R, M): counted targets of every micro-batch of the step
        w, scale = weights(table, normalise), backward_scales(table, normalise)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        opt.zero_grad(set_to_none=True)
        sums = torch.zeros(4, dtype=torch.float64, device=device)  # objective part, response loss, count, padded
        for m, batch in enumerate(mine):
            sync = m == M - 1 or R == 1
            with nullcontext() if sync else net.no_sync():
                with _autocast(device):
                    logits = _forward(net, batch, cfg.backend)  # (B, T, V)
                summed = token_losses(logits.float(), batch.labels).sum()  # scalar: sum over counted targets
                (summed * float(scale[rank, m])).backward()
            sums[0] += float(summed.detach()) * float(w[rank, m])
            if real_mb[m]:  # the stand-in of an empty micro-batch has no response, no tokens
                response = batch.completion_labels  # (B, T)
                sums[1] += float(token_losses(logits.detach().float(), response).sum())
                sums[2] += float((response[:, 1:] != IGNORE_INDEX).sum())
                sums[3] += float(batch.input_ids.numel())
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        opt.step()
        _all_reduce(sums, R)
        dt = time.perf_counter() - t0
        elapsed += dt
        costs = [pack_costs(p) for p in packs]
        real = sum(int(c["tokens"].sum()) for c in costs)
        values = {
            "reported_loss": float(sums[0]),
            "response_loss": float(sums[1] / sums[2]) if sums[2] > 0 else 0.0,
            "real_tokens": real,
            "real_tokens_per_s": real / dt,
            "padded_tokens_per_s": float(sums[3]) / dt,
            "elapsed_s": elapsed,
            "targets": int(table.sum()),
            "straggler_tokens": straggler_ratio([c["tokens"].sum() for c in costs]),
            "straggler_attention": straggler_ratio([c["attention"].sum() for c in costs]),
        }
        record = StepRecord("train", setup.name, seed, step + 1, values)
        run.add(record)
        run.extra.setdefault("targets", []).append(table.tolist())  # (R, M) counted targets per step
        if callback is not None:
            callback(record)
    model.eval()
    train = run.curves["train"]
    tail = min(20, cfg.steps)
    run.final = {k: sum(train[k][-tail:]) / tail for k in ("reported_loss", "response_loss")}
    run.final["train_time_s"] = elapsed
    run.wall_s = time.perf_counter() - start
    run.extra.update(world_size=R, grad_accum=M, normalise=normalise, balance=balance)
    return run


# ------------------------------------------------------------------------------ outputs


def save_output(run: RunResult, model, out: str | Path, config: dict, env: dict) -> Path:
    """Write results.json (one run), model.pt and losses.json (full precision) under ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    Results(runs=[run], config=config, env=env, wall_s=run.wall_s).save(out / "results.json")
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, out / "model.pt")
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
            "state": torch.load(out / "model.pt", map_location="cpu", weights_only=True)}


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


# ------------------------------------------------------------------------------ the command


def torchrun_command(nproc: int, train_args: list[str]) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc_per_node N -m packsim train ARGS``."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
            "-m", "packsim", "train", *train_args]


_OPTIONS = ("setup", "steps", "examples_per_step", "grad_accum", "seed", "out", "normalise", "balance",
            "data", "capacity", "lr", "model_size", "engine", "device")


def _train_argv(args: argparse.Namespace) -> list[str]:
    """The options of ``args`` as command-line words (``--nproc`` left out): what each rank gets."""
    argv = []
    for name in _OPTIONS:
        value = getattr(args, name, None)
        if value is not None:
            argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv + (["--quiet"] if args.quiet else [])


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--setup", default="correct", help="setup preset or mask+positions+loss (default: correct)")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps (default 20)")
    p.add_argument("--examples-per-step", type=int, default=32, help="global examples per step, all ranks (default 32)")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per rank per step (default 1)")
    p.add_argument("--seed", type=int, default=0, help="data and model seed (default 0)")
    p.add_argument("--normalise", default="global",
                   help="global (count over ranks and micro-batches: right), local (per-rank count), "
                        "mean (mean of per-micro-batch means); default global")
    p.add_argument("--balance", default="none", help="none (each rank packs its share of the examples), or pack "
                   "the step once and deal packs by round_robin, tokens or attention (default none)")
    p.add_argument("--data", default="tasks", help="tasks (default) or long_tailed (unequal response counts)")
    p.add_argument("--capacity", type=int, default=256, help="tokens per pack (default 256)")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate (default 2e-3)")
    p.add_argument("--model-size", default="tiny", help="tiny (default) or small")
    p.add_argument("--engine", default="packsim", help="packsim (this DDP loop, default) or trainer "
                   "(transformers Trainer + PackingCollator; normalise global/local/mean)")
    p.add_argument("--device", default=None, help="cpu, cuda (default: packsim.get_device(); rank i uses cuda:i)")
    p.add_argument("--nproc", type=int, default=None, help="launch N processes through torchrun (same as "
                   "`python -m torch.distributed.run --standalone --nproc_per_node N -m packsim train ...`)")
    p.add_argument("--out", default="runs/train", help="output folder (default runs/train)")
    p.add_argument("--quiet", action="store_true", help="no per-step lines")


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
        from packsim.experiment.trainer_parallel import check_trainer_args

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
        from packsim.experiment.trainer_parallel import train_with_trainer

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
