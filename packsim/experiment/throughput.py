"""Throughput: one training step timed, and each setup's real tokens/s, packed vs padded.

:func:`timed_step` is packsim's one step timer: forward, the loss
(:func:`packsim.core.loss.packed_cross_entropy`: every counted target of the step weighs the
same), backward over the step's micro-batches (PackedBatches, rows (B, T), logits (B, T, V)),
then ``optimizer.step()``. Appendix A1 and ``benchmarks/throughput.py`` time packed and padded
versions of the same steps with it, side by side.

:func:`measure_throughput` is the comparison's measurement: the same examples per step for every
setup, ``examples_per_step`` of long-tailed lengths (median 90 tokens,
:func:`packsim.core.data.make_long_tailed_examples`), packed into rows of ``capacity`` tokens,
(B, capacity), or, for ``padded``, one example per row padded to the longest of the step,
(examples_per_step, L_max). Each setup trains the tiny model for ``steps`` steps after one warm-up
step; the medians over those steps go into ``results.json``'s ``throughput``
(:func:`~packsim.experiment.comparison.run_comparison` calls it after the runs).

Lessons: A1 (lesson 06 reads measure_throughput's numbers from a comparison's results).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from packsim.core.batch import PackedBatch
from packsim.core.data import make_long_tailed_examples
from packsim.core.errors import PacksimError
from packsim.core.loss import count_targets, packed_cross_entropy
from packsim.core.model import build_model, forward
from packsim.experiment.training import TrainConfig, make_batches, train

__all__ = ["timed_step", "measure_throughput"]


def timed_step(model, optimizer, batches: PackedBatch | Sequence[PackedBatch],
               sync: Callable[[], None] | None = None, backend: str = "auto") -> dict:
    """One optimizer step over ``batches`` (its micro-batches, gradients accumulated), timed.

    Each micro-batch's loss is its summed per-token loss over the counted targets of the whole
    step (``packed_cross_entropy(..., num_items=...)``), so packed and padded steps weigh every
    response token the same; one batch gives the plain mean. The clock runs from
    ``zero_grad`` to after ``optimizer.step()``; ``sync`` (e.g. ``torch.cuda.synchronize``) is
    called at both ends so the time includes the device's queued work. Batches must already be
    on the model's device. Returns ``{"seconds", "loss", "real_tokens", "all_tokens", "rows"}``
    (``all_tokens``: token slots, padding included).
    """
    batches = [batches] if isinstance(batches, PackedBatch) else list(batches)
    if not batches or not all(isinstance(b, PackedBatch) for b in batches):
        raise PacksimError("timed_step needs a PackedBatch or a non-empty list of them (one "
                           "optimizer step's micro-batches): build them with make_batches or "
                           "PackedBatch.from_examples.")
    num_items = sum(count_targets(b.labels) for b in batches)
    if sync:
        sync()
    t0 = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for b in batches:
        logits = forward(model, b, backend=backend)  # (B, T, V)
        loss = packed_cross_entropy(logits, b.labels, num_items=num_items)  # ()
        loss.backward()
        total += loss.detach()
    optimizer.step()
    if sync:
        sync()
    seconds = time.perf_counter() - t0
    return {
        "seconds": seconds,
        "loss": float(total),
        "real_tokens": sum(b.n_real_tokens for b in batches),
        "all_tokens": sum(b.shape[0] * b.shape[1] for b in batches),
        "rows": sum(b.shape[0] for b in batches),
    }


def measure_throughput(setups: Sequence[str], steps: int, device, capacity: int = 1024,
                       examples_per_step: int = 48, seed: int = 0) -> dict:
    """Real tokens/s of each setup on long-tailed lengths (median 90), same examples per step.

    Padded rows are padded to the longest example of the step (what a plain collator does).
    Returns ``{setup: {"real_tokens_per_s", "padded_tokens_per_s", "fill"}}``, median over steps.
    """
    if steps <= 0:
        return {}
    examples = make_long_tailed_examples(examples_per_step * (steps + 1), seed=seed, max_len=capacity)
    out = {}
    for name in setups:
        model = build_model("tiny", seed=seed).to(device)
        tcfg = TrainConfig(steps=steps + 1, examples_per_step=examples_per_step, capacity=capacity,
                           warmup_steps=1, eval_every=0)
        run = train(model, examples, name, tcfg, seed=seed, progress=False)
        tr = run.curves["train"]
        real = sorted(tr["real_tokens_per_s"][1:])
        padded = sorted(tr["padded_tokens_per_s"][1:])
        batch = make_batches(examples[:examples_per_step], capacity, name, examples_per_step)[0]
        out[name] = {
            "real_tokens_per_s": real[len(real) // 2],
            "padded_tokens_per_s": padded[len(padded) // 2],
            "fill": batch.n_real_tokens / batch.input_ids.numel(),
            "steps": steps,
        }
    return out
