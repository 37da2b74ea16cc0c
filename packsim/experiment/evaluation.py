"""Evaluation on held-out examples, run **alone** (one example per row, positions from 0).

Notebook 06 uses it to score the models the experiment trains. Two numbers per example set:

- response-only loss: mean cross-entropy over response tokens and EOS;
- exact match by greedy decoding: the model, given ``<bos> + prompt``, must produce the response
  and then ``<eos>``. Greedy decoding reproduces the gold response exactly when, and only when,
  every next-token argmax along the gold response is right, so :func:`evaluate_isolated` scores it
  in one teacher-forced pass; :func:`greedy_decode` does it token by token (tests check they agree).

:func:`evaluate_packed` scores the same examples *inside packs* under a training setup: the
train/eval mismatch. A model trained with the default causal mask is scored on what it was trained
to do (read its neighbours); alone it has no neighbours.

Lessons: none directly (the comparison scores its models with it).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from packsim.core.batch import PackedBatch
from packsim.core.device import model_device
from packsim.core.errors import PacksimError
from packsim.core.loss import IGNORE_INDEX, token_losses
from packsim.core.model import forward
from packsim.core.setups import Setup, get_setup
from packsim.core.tokenizer import EOS_ID

__all__ = [
    "evaluate_isolated",
    "evaluate_packed",
    "held_out_metrics",
    "greedy_decode",
    "example_scores",
    "scores_from_logits",
]


@torch.no_grad()
def scores_from_logits(logits: torch.Tensor, batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example response loss and exact match from logits (B, T, V) of ``batch``.

    Returns ``(loss, exact)``, each (N,) indexed like the examples the batch was built from: the
    mean loss over each example's response tokens and EOS, and whether every one of their argmax
    predictions is right (greedy exact match). Scores response + EOS whatever loss the setup
    trains with; an example with no response token in the batch gets loss 0 and exact False.
    """
    labels = batch.completion_labels  # (B, T)
    counted = labels[:, 1:] != IGNORE_INDEX  # (B, T-1): position t predicts token t + 1
    nll = token_losses(logits, labels)[counted]  # (K,) over counted targets
    wrong = (logits[:, :-1].argmax(-1) != labels[:, 1:])[counted].float()  # (K,)
    owner = batch.seq_ids[:, 1:][counted]  # (K,): example index of each target
    n_ex = len(batch.lengths)
    total = torch.zeros(n_ex, device=nll.device).index_add_(0, owner, nll.float())
    count = torch.zeros(n_ex, device=nll.device).index_add_(0, owner, torch.ones_like(nll, dtype=torch.float))
    errors = torch.zeros(n_ex, device=nll.device).index_add_(0, owner, wrong)
    return (total / count.clamp(min=1)).cpu(), ((errors == 0) & (count > 0)).cpu()


@torch.no_grad()
def example_scores(model, batch: PackedBatch, backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``batch`` under its setup and score each example (see :func:`scores_from_logits`)."""
    model.eval()
    return scores_from_logits(forward(model, batch, backend=backend).float(), batch)


def _chunks(examples: Sequence, size: int):
    for i in range(0, len(examples), size):
        yield examples[i : i + size]


def _check_examples(examples: Sequence) -> None:
    if len(examples) == 0:
        raise PacksimError("no examples to evaluate: pass a non-empty list of held-out examples.")


def _summarise(losses: torch.Tensor, exact: torch.Tensor, tasks: list[str]) -> dict:
    by_task = {}
    for task in sorted(set(tasks)):
        idx = torch.tensor([t == task for t in tasks])
        by_task[task] = float(exact[idx].float().mean())
    return {
        "exact_match": float(exact.float().mean()),
        "response_loss": float(losses.mean()),
        "exact_match_by_task": by_task,
        "n": len(tasks),
    }


def evaluate_isolated(model, examples: Sequence, batch_size: int = 128, backend: str = "auto") -> dict:
    """Score each example **alone**: one example per row, padded after it, positions from 0.

    Returns ``{"exact_match", "response_loss", "exact_match_by_task", "n"}`` (means over examples).
    Rows are built with the ``padded`` setup: a causal mask over a row that holds a single example
    followed by padding, so nothing but the example itself is visible.

    Example::

        >>> import packsim
        >>> scores = packsim.evaluate_isolated(packsim.build_model("tiny"), packsim.make_examples(4))
        >>> scores["n"], 0.0 <= scores["exact_match"] <= 1.0
        (4, True)
    """
    _check_examples(examples)
    losses, exact = [], []
    for chunk in _chunks(examples, batch_size):
        longest = max(len(ex.tokens) for ex in chunk)
        batch = PackedBatch.from_examples(chunk, longest, setup="padded")
        loss, ok = example_scores(model, batch.to(model_device(model)), backend)
        losses.append(loss)
        exact.append(ok)
    return _summarise(torch.cat(losses), torch.cat(exact), [getattr(ex, "task", "custom") for ex in examples])


def evaluate_packed(
    model,
    examples: Sequence,
    setup: str | Setup,
    capacity: int,
    strategy: str = "sequential",
    backend: str = "auto",
) -> dict:
    """Score the same examples **inside packs** built for ``setup`` (same keys as isolated).

    ``strategy="sequential"`` keeps the examples' order, so neighbours in the list are neighbours
    in the pack. Under a setup with a block-diagonal mask this equals :func:`evaluate_isolated`
    (up to float noise); under the causal mask each example also sees the ones before it.
    """
    _check_examples(examples)
    setup = get_setup(setup)
    if not setup.packed:
        return evaluate_isolated(model, examples, backend=backend)
    batch = PackedBatch.from_examples(examples, capacity, setup=setup, strategy=strategy)
    loss, ok = example_scores(model, batch.to(model_device(model)), backend)
    return _summarise(loss, ok, [getattr(ex, "task", "custom") for ex in examples])


def held_out_metrics(model, examples: Sequence, setup: str | Setup | None = None, capacity: int = 256) -> dict:
    """The trainer's eval record (:data:`packsim.experiment.results.EVAL_KEYS`) for held-out ``examples``.

    ``isolated_exact_match`` and ``isolated_response_loss`` (each example alone); with ``setup``,
    also ``packed_exact_match`` and ``packed_response_loss`` (the same examples packed in data
    order under ``setup``). Pass ``lambda model, step: held_out_metrics(model, test, setup)`` as
    :func:`packsim.experiment.training.train`'s ``evaluate``.
    """
    iso = evaluate_isolated(model, examples)
    out = {"isolated_exact_match": iso["exact_match"], "isolated_response_loss": iso["response_loss"]}
    if setup is not None:
        packed = evaluate_packed(model, examples, setup, capacity)
        out.update(packed_exact_match=packed["exact_match"], packed_response_loss=packed["response_loss"])
    return out


@torch.no_grad()
def greedy_decode(model, example, max_new_tokens: int | None = None) -> list[int]:
    """Greedy continuation of ``<bos> + prompt`` of one example, alone, until ``<eos>``.

    Returns the generated ids without ``<eos>``. Slow (one full forward per token, no cache):
    for showing answers and for checking :func:`evaluate_isolated`'s one-pass exact match.
    """
    model.eval()
    device = model_device(model)
    ids = list(example.tokens[: example.n_prompt])
    limit = max_new_tokens if max_new_tokens is not None else len(example.tokens) - example.n_prompt + 4
    out: list[int] = []
    for _ in range(limit):
        x = torch.tensor([ids + out], device=device)  # (1, t)
        pos = torch.arange(x.shape[1], device=device)[None]  # (1, t): positions from 0
        nxt = int(model(input_ids=x, position_ids=pos, use_cache=False).logits[0, -1].argmax())
        if nxt == EOS_ID:
            break
        out.append(nxt)
    return out
