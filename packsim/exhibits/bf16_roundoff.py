"""Packed vs alone differs in bf16 with a correct mask: a leak? The layout comparison against the perturbation probe.

In bf16 a correctly packed forward need not equal each example run alone. The pack runs other shapes
(one row of N tokens under a mask; alone: L tokens, no mask, SDPA's ``is_causal``), so matmuls and
softmax reduce in another order, or in another kernel, and round differently: a bf16 number has 8
significant bits, so at a logit near 10 one step is 1/16. The perturbation probe keeps the layout: it
changes one example's tokens and reruns the **same** packed call, so every other example's arithmetic
is the same operations on the same numbers, and an isolated forward changes them by exactly 0 in any
dtype (a masked score is exactly 0 after the softmax, and adding zeros rounds nothing). A leak moves
them by far more than round-off.

Measured on a tiny Llama (``sdpa``; lesson A8 passes the committed trained ``correct`` model's
weights: its logits reach about 13, random weights' stay below 1), examples packed in one row by
``DataCollatorWithFlattening`` (input_ids, position_ids (1, T)), two calls: ``correct`` (no mask,
``use_cache=False``: transformers detects the pack) and ``all-ones mask`` (trap 2: one causal mask
over the row), in fp32 and bf16. Per call:

- ``alone``: max over tokens of |packed logit - the example alone's| (alone: input_ids (1, L));
- ``steps``: the same difference in steps of the dtype at the token's largest logit (max |diff| over
  the vocabulary / the spacing at max |logit|, the scale its sums round at): a few is round-off;
- ``probe``: max |change of another example's logits| when one example's tokens change (same call);
- the audit (:func:`packsim.audit`) on the same batch: its verdict and tolerance
  (:data:`packsim.auditing.auditor.TOLERANCE`: fp32 1e-5, bf16 3e-2).

Lessons: A8.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from packsim.core.text_table import text_table

__all__ = ["CALLS", "RoundoffRow", "roundoff_rows", "roundoff_text", "spacing"]

CALLS = ("correct", "all-ones mask")


def spacing(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The gap between ``|x|`` and the next larger number of ``dtype``: 2**floor(log2|x|) * eps (|x| >= tiny)."""
    info = torch.finfo(dtype)
    mag = x.abs().float().clamp(min=info.tiny)
    return torch.exp2(torch.floor(torch.log2(mag))) * info.eps


@dataclass(frozen=True)
class RoundoffRow:
    """One (dtype, call): the layout comparison, the probe, and the audit's verdict on the same batch."""

    dtype: str
    call: str
    alone: float
    steps: float
    probe: float
    audit_status: str
    audit_tol: float


def _model(state_dict, dtype):
    from packsim.core.model import build_model

    model = build_model("tiny", attn_implementation="sdpa", seed=0)
    if state_dict is not None:
        model.load_state_dict(state_dict, strict=False)  # the tied lm_head may be stored once
    return model.to(dtype).eval()


def _row(model, batch: dict, seq: torch.Tensor, examples, dtype, call: str) -> RoundoffRow:
    import packsim

    V = model.config.vocab_size
    with torch.no_grad():
        packed = model(**batch, use_cache=False).logits[0].float()  # (T, V)
        worst, steps = 0.0, 0.0
        for j, ex in enumerate(examples):
            alone = model(input_ids=torch.tensor([ex]), use_cache=False).logits[0].float()  # (L, V)
            mine = packed[seq == j]
            diff = (mine - alone).abs()
            worst = max(worst, float(diff.max()))
            scale = torch.maximum(mine.abs().amax(-1), alone.abs().amax(-1))  # (L,) each token's largest logit
            steps = max(steps, float((diff.amax(-1) / spacing(scale, dtype)).max()))
        probe = 0.0
        for j in range(len(examples)):
            ids = batch["input_ids"].clone()
            where = seq[None] == j
            ids[where] = (ids[where] - 3 + 7) % (V - 3) + 3  # other text tokens, same places
            moved = (model(**{**batch, "input_ids": ids}, use_cache=False).logits[0].float() - packed).abs()
            probe = max(probe, float(moved[(seq >= 0) & (seq != j)].max()))
    report = packsim.audit(model, batch, examples=[list(ex) for ex in examples], use_cache=False)
    return RoundoffRow(str(dtype).replace("torch.", ""), call, worst, steps, probe, report.status,
                       report.probes["perturbation"].threshold)


def roundoff_rows(state_dict: dict | None = None, examples=None,
                  dtypes=(torch.float32, torch.bfloat16)) -> list[RoundoffRow]:
    """Every (dtype, call) of the module docstring on ``examples`` (token id lists; default the first
    12 training examples of ``make_dataset(seed=0)``)."""
    from transformers import DataCollatorWithFlattening

    if examples is None:
        from packsim.core.data import make_dataset

        examples = [ex.tokens for ex in make_dataset(12, 0, seed=0)[0]]
    lengths = [len(ex) for ex in examples]
    batch = dict(DataCollatorWithFlattening()([{"input_ids": list(ex)} for ex in examples]))  # (1, T) each
    batch = {k: v for k, v in batch.items() if k != "labels"}
    seq = torch.repeat_interleave(torch.arange(len(examples)), torch.tensor(lengths))  # (T,)
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for dtype in dtypes:
            model = _model(state_dict, dtype)
            for call in CALLS:
                b = batch if call == "correct" else {**batch, "attention_mask": torch.ones_like(batch["input_ids"])}
                rows.append(_row(model, b, seq, examples, dtype, call))
    return rows


def roundoff_text(rows: list[RoundoffRow]) -> str:
    table = [("dtype", "call", "packed vs alone", "in steps of the dtype", "perturbation probe", "packsim.audit")]
    for r in rows:
        table.append((r.dtype, r.call, f"{r.alone:.1e}", f"{r.steps:.2f}", f"{r.probe:.1e}",
                      f"{r.audit_status.upper()} (tolerance {r.audit_tol:.0e})"))
    return "\n".join(text_table(table))
