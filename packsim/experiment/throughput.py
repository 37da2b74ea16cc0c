"""Throughput on the long-tailed mix: real tokens/s of each setup, packed vs padded.

The same examples per step for every setup: ``examples_per_step`` of long-tailed lengths (median
90 tokens, :func:`packsim.core.data.make_long_tailed_examples`), packed into rows of ``capacity``
tokens, (B, capacity), or, for ``padded``, one example per row padded to the longest of the step,
(examples_per_step, L_max). Each setup trains the tiny model for ``steps`` steps after one warm-up
step; the medians over those steps go into ``results.json``'s ``throughput``
(:func:`~packsim.experiment.comparison.run_comparison` calls it after the runs).

Lessons: none directly (lesson 06 reads the numbers from a comparison's results).
"""

from __future__ import annotations

from collections.abc import Sequence

from packsim.core.data import make_long_tailed_examples
from packsim.core.model import build_model
from packsim.experiment.training import TrainConfig, make_batches, train

__all__ = ["measure_throughput"]


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
