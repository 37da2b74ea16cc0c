"""The trainer of the experiment (notebook 06): the same model, data, budget and seed under any setup.

``make_batches`` cuts the examples into steps of ``examples_per_step`` **before** packing, so
every setup (buggy, correct, padded, ...) sees the identical examples in the identical order and
the identical number of real tokens; only the setup differs.

:func:`train` records, every step, what a user of that setup would watch (the loss its trainer
reports) next to what matters (the response-only loss of the same batch), and the throughput in
real and padded tokens per second; every ``eval_every`` steps it calls an evaluation (isolated
held-out examples, :mod:`packsim.experiment.evaluation`). Records go to a :class:`~packsim.experiment.results.RunResult`
and, live, to ``callback(record)`` (the curves widget's ``.callback``).

Deterministic on CPU for a given seed. On CUDA it trains under bf16 autocast.

Lessons: 01, 02, 10, A1, A2, A4.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
from tqdm.auto import tqdm

from packsim.core.batch import PackedBatch
from packsim.core.device import model_device
from packsim.core.errors import PacksimError
from packsim.core.loss import packed_cross_entropy
from packsim.core.model import forward
from packsim.core.setups import Setup, get_setup
from packsim.experiment.evaluation import scores_from_logits
from packsim.experiment.results import RunResult, StepRecord

__all__ = ["TrainConfig", "lr_at", "make_optimizer", "optimizer_step", "autocast", "make_batches", "train"]


@dataclass
class TrainConfig:
    """Optimisation and budget of one run (the same for every setup of a comparison).

    Example::

        >>> import packsim
        >>> cfg = packsim.TrainConfig(steps=2, examples_per_step=4, capacity=64, warmup_steps=1, eval_every=2)
        >>> cfg.steps * cfg.examples_per_step  # examples one run consumes
        8
    """

    steps: int = 600
    examples_per_step: int = 224  # ~15 packs of 256 tokens with the default task mix
    capacity: int = 256
    strategy: str = "bfd"
    lr: float = 2e-3
    betas: tuple[float, float] = (0.9, 0.98)
    warmup_steps: int = 30
    min_lr_ratio: float = 0.1  # cosine decay to lr * min_lr_ratio
    clip: float = 1.0
    eval_every: int = 100  # 0: evaluate only after the last step
    backend: str = "auto"

    def as_dict(self) -> dict:
        return asdict(self)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate at ``step`` (0-based): linear warmup, then cosine to ``lr * min_lr_ratio``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(cfg.steps - cfg.warmup_steps, 1)
    progress = min((step - cfg.warmup_steps) / span, 1.0)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(model, cfg: TrainConfig) -> torch.optim.AdamW:
    """The course's optimiser: AdamW at ``cfg.lr`` and ``cfg.betas``, no weight decay."""
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=0.0)


def optimizer_step(model, opt: torch.optim.Optimizer, step: int, cfg: TrainConfig) -> None:
    """After the backward pass(es) of ``step`` (0-based): clip the gradient norm, update at ``lr_at(step)``."""
    for group in opt.param_groups:
        group["lr"] = lr_at(step, cfg)
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
    opt.step()


def autocast(device: torch.device):
    """bf16 autocast on CUDA; on CPU the forward runs in float32 (autocast off)."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def make_batches(
    examples: Sequence,
    capacity: int,
    setup: str | Setup,
    examples_per_step: int,
    strategy: str = "bfd",
    overflow: str = "error",
) -> list[PackedBatch]:
    """One PackedBatch per step from consecutive chunks of ``examples_per_step`` examples."""
    setup = get_setup(setup)
    chunks = [examples[i : i + examples_per_step] for i in range(0, len(examples), examples_per_step)]
    return [PackedBatch.from_examples(c, capacity, setup, strategy=strategy, overflow=overflow) for c in chunks]


def _check_budget(examples: Sequence, cfg: TrainConfig) -> None:
    need = cfg.steps * cfg.examples_per_step
    if len(examples) < need:
        raise PacksimError(
            f"{cfg.steps} steps x {cfg.examples_per_step} examples need {need} training examples, "
            f"got {len(examples)}: generate more (e.g. make_dataset(n_train={need}, ...)) or "
            "lower steps / examples_per_step."
        )


def _group_losses(logits: torch.Tensor, batch: PackedBatch, groups: Sequence[str] | None) -> dict:
    """Mean in-pack response loss per group label (e.g. first vs repeated copy of a question)."""
    if groups is None:
        return {}
    losses, _ = scores_from_logits(logits.detach().float(), batch)  # (N,) per example
    out = {}
    for g in sorted(set(groups)):
        idx = torch.tensor([x == g for x in groups])
        out[f"response_loss_{g}"] = float(losses[idx].mean())
    return out


def train(
    model,
    examples: Sequence,
    setup: str | Setup,
    cfg: TrainConfig | None = None,
    seed: int = 0,
    evaluate: Callable[[object, int], dict] | None = None,
    callback: Callable[[StepRecord], None] | None = None,
    groups: Sequence[str] | None = None,
    data: str = "tasks",
    progress: bool = True,
) -> RunResult:
    """Train ``model`` in place for ``cfg.steps`` steps on ``examples`` under ``setup``.

    Args:
        examples: at least ``steps * examples_per_step`` examples, consumed in order.
        evaluate: ``evaluate(model, step) -> {name: value}``, called every ``cfg.eval_every``
            steps and after the last one (its time is excluded from throughput).
        callback: gets every :class:`StepRecord` as it is made (live widgets).
        groups: optional label per training example (e.g. ``"first"`` / ``"repeat"``): each
            step also records ``response_loss_<label>``, the in-pack loss of that group.
    Returns:
        the run's :class:`RunResult` (``curves["train"]``, ``curves["eval"]``, ``final``).

    Example::

        >>> import packsim
        >>> model = packsim.build_model("tiny", seed=0)
        >>> cfg = packsim.TrainConfig(steps=2, examples_per_step=4, capacity=64, warmup_steps=1, eval_every=2)
        >>> run = packsim.train(model, packsim.make_examples(8), "correct", cfg, progress=False)
        >>> len(run.curves["train"]["step"])
        2
    """
    cfg = cfg or TrainConfig()
    setup = get_setup(setup)
    _check_budget(examples, cfg)
    n = cfg.steps * cfg.examples_per_step
    batches = make_batches(examples[:n], cfg.capacity, setup, cfg.examples_per_step, cfg.strategy)
    per_step = cfg.examples_per_step
    step_groups = None if groups is None else [groups[i : i + per_step] for i in range(0, n, per_step)]
    device = model_device(model)
    torch.manual_seed(seed)
    opt = make_optimizer(model, cfg)
    run = RunResult(setup=setup.name, seed=seed, data=data)

    def emit(kind: str, step: int, values: dict) -> None:
        record = StepRecord(kind, setup.name, seed, step, values)
        run.add(record)
        if callback is not None:
            callback(record)

    elapsed, start = 0.0, time.perf_counter()
    bar = tqdm(batches, desc=f"{setup.name} seed {seed}", disable=not progress, leave=False)
    for step, batch in enumerate(bar):
        model.train()
        t0 = time.perf_counter()
        batch = batch.to(device)
        with autocast(device):
            logits = forward(model, batch, backend=cfg.backend)  # (B, T, V)
        loss = packed_cross_entropy(logits.float(), batch.labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        optimizer_step(model, opt, step, cfg)
        reported = loss.item()  # syncs, so the step time below is complete
        dt = time.perf_counter() - t0
        elapsed += dt
        values = {
            "reported_loss": reported,
            "response_loss": _response_loss(logits, batch),
            "real_tokens": batch.n_real_tokens,
            "real_tokens_per_s": batch.n_real_tokens / dt,
            "padded_tokens_per_s": batch.input_ids.numel() / dt,
            "elapsed_s": elapsed,
            **_group_losses(logits, batch, step_groups[step] if step_groups else None),
        }
        emit("train", step + 1, values)
        bar.set_postfix(loss=f"{reported:.3f}")
        last = step + 1 == cfg.steps
        if evaluate is not None and (last or (cfg.eval_every and (step + 1) % cfg.eval_every == 0)):
            emit("eval", step + 1, evaluate(model, step + 1))
    model.eval()
    run.final = _final(run)
    run.wall_s = time.perf_counter() - start
    return run


def _response_loss(logits: torch.Tensor, batch: PackedBatch) -> float:
    """Mean loss over the batch's response tokens and EOS (every response token weighs the same)."""
    return float(packed_cross_entropy(logits.detach().float(), batch.completion_labels))


def _final(run: RunResult, tail: int = 20) -> dict:
    """Final metrics: last evaluation, mean of the last ``tail`` steps' losses, median throughput."""
    train = run.curves["train"]
    final = {}
    for key in ("reported_loss", "response_loss"):
        col = train[key][-tail:]
        final[key] = sum(col) / len(col)
    for key in ("real_tokens_per_s", "padded_tokens_per_s"):
        col = sorted(train[key][min(5, len(train[key]) - 1) :])  # skip warm-up steps
        final[key] = col[len(col) // 2]
    for key in [k for k in train if k.startswith("response_loss_")]:
        col = [v for v in train[key][-tail:] if v is not None]
        final[key] = sum(col) / len(col) if col else None
    for key, col in run.curves.get("eval", {}).items():
        if key != "step" and col:
            final[key] = col[-1]
    final["train_time_s"] = train["elapsed_s"][-1]
    return final
