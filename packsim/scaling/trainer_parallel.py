"""``packsim train --engine trainer``: the transformers ``Trainer`` with ``PackingCollator`` on 1..N processes (lesson 10).

Launched with ``accelerate launch --cpu --num_processes 2 -m packsim train --engine trainer ...``
(or torchrun), the ``Trainer`` wraps the model in DistributedDataParallel itself. Each rank packs
its micro-batch of ``E / (R * M)`` examples into one flattened row (``PackingCollator``), in the
order of a ``SequentialSampler`` sharded by accelerate, so the global batch of each optimiser step
is the same examples as one process with ``per_device_train_batch_size = E``.

How the Trainer normalises the loss (read in the installed ``transformers/trainer.py``):

- ``_get_num_items_in_batch`` counts ``labels[..., 1:] != -100`` over the step's micro-batches
  of this rank; with ``average_tokens_across_devices=True`` (the default) and ``world_size > 1``
  it replaces that count by the sum gathered over ranks (``accelerator.gather(...).sum()``);
- the model divides its summed token loss by ``num_items_in_batch`` (``model_accepts_loss_kwargs``:
  Llama's ``forward`` takes ``**kwargs``), and ``compute_loss`` multiplies the loss by
  ``accelerator.num_processes`` when ``average_tokens_across_devices`` is on, undoing DDP's average;
- with the flag off, each rank divides by its own count: DDP then averages per-rank means;
- with ``model_accepts_loss_kwargs = False`` the model's own mean of each micro-batch is divided by
  the accumulation steps in ``training_step``: the mean of micro-batch means.

So ``--normalise global`` maps to ``average_tokens_across_devices=True``, ``local`` to ``False``,
and ``mean`` to ``model_accepts_loss_kwargs = False``, each checked against one process in
``tests/test_data_parallel.py`` and lesson 10.

Lessons: none directly.
"""

from __future__ import annotations

import shutil
import tempfile
import time

import torch
import torch.distributed as dist

from packsim.core.collator import PackingCollator
from packsim.core.device import model_device
from packsim.core.errors import PacksimError
from packsim.core.setups import get_setup
from packsim.experiment.results import RunResult, StepRecord
from packsim.experiment.training import TrainConfig, lr_at, make_optimizer
from packsim.scaling.launch_env import world

__all__ = ["check_trainer_args", "train_with_trainer"]


def check_trainer_args(cfg: TrainConfig, world_size: int, grad_accum: int, balance: str) -> None:
    """The Trainer needs ``E`` divisible by ranks x micro-batches and deals examples itself."""
    if cfg.examples_per_step % (world_size * grad_accum):
        raise PacksimError(
            f"--engine trainer needs --examples-per-step ({cfg.examples_per_step}) divisible by processes x "
            f"--grad-accum ({world_size} x {grad_accum}): per_device_train_batch_size must be a whole number."
        )
    if balance != "none":
        raise PacksimError("--balance is for the packsim engine: the Trainer deals examples to ranks itself.")


def train_with_trainer(model, examples: list, setup, cfg: TrainConfig, seed: int, grad_accum: int,
                       normalise: str, data: str = "tasks", quiet: bool = False) -> RunResult:
    """Train ``model`` in place with ``transformers.Trainer``; the run's curve is the Trainer's logged loss."""
    from transformers import PrinterCallback, Trainer, TrainingArguments

    setup = get_setup(setup)
    n = cfg.steps * cfg.examples_per_step
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="packsim-trainer-"),
        per_device_train_batch_size=cfg.examples_per_step // (world()[1] * grad_accum),
        gradient_accumulation_steps=grad_accum,
        max_steps=cfg.steps,
        max_grad_norm=cfg.clip,
        train_sampling_strategy="sequential",
        average_tokens_across_devices=normalise == "global",
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        remove_unused_columns=False,
        dataloader_num_workers=0,
        use_cpu=model_device(model).type == "cpu",
        seed=seed,
        disable_tqdm=True,
        ddp_find_unused_parameters=False,
    )
    opt = make_optimizer(model, cfg)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_at(s, cfg) / cfg.lr)
    model.train()
    trainer = Trainer(model=model, args=args, train_dataset=examples[:n], optimizers=(opt, sched),
                      data_collator=PackingCollator(setup=setup, return_flash_attn_kwargs=True))
    if quiet:
        trainer.remove_callback(PrinterCallback)
    if normalise == "mean":
        trainer.model_accepts_loss_kwargs = False  # the model's own per-micro-batch mean
    start = time.perf_counter()
    try:
        trainer.train()
    finally:
        shutil.rmtree(args.output_dir, ignore_errors=True)  # save_strategy="no": nothing worth keeping
    model.eval()
    run = RunResult(setup=setup.name, seed=seed, data=data)
    for h in trainer.state.log_history:
        if "loss" in h:
            run.add(StepRecord("train", setup.name, seed, int(h["step"]), {"reported_loss": float(h["loss"])}))
    run.wall_s = time.perf_counter() - start
    losses = run.curves["train"]["reported_loss"]
    run.final = {"reported_loss": sum(losses[-20:]) / len(losses[-20:]), "train_time_s": run.wall_s}
    run.extra.update(world_size=world()[1], grad_accum=grad_accum, normalise=normalise, engine="trainer",
                     average_tokens_across_devices=args.average_tokens_across_devices,
                     model_accepts_loss_kwargs=trainer.model_accepts_loss_kwargs,
                     distributed_type=str(trainer.accelerator.distributed_type),
                     backend=dist.get_backend() if dist.is_initialized() else None)
    return run
