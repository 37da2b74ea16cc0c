"""Exercise of notebook 00_start_here: how much of a batch is padding.

``check_padding_share(fn)``: ``fn(batch) -> float``, the share of a batch's (B, T) token slots
that hold padding rather than a token of an example. Any real number within 5e-5 of the share
passes (a float, a Fraction, a 0-d tensor or numpy scalar; rounded to 4 decimals is fine),
whatever formula computed it; the usual mistakes (the real share, a count, a percent, dividing by
the real tokens) are named.
"""

from __future__ import annotations

import math
import numbers

from packsim.core.batch import PackedBatch
from packsim.core.data import make_examples
from packsim.course.exercises import Feedback, check, fail, ok

__all__ = ["check_padding_share"]

_TOL = 5e-5  # a share rounded to 4 decimals still passes; the named mistakes are far further away


def _scalar(x):
    """``x`` as a Python number when it holds one value (a 0-d or one-element tensor / numpy array)."""
    size = x.numel() if callable(getattr(x, "numel", None)) else getattr(x, "size", None)
    return x.item() if size == 1 and callable(getattr(x, "item", None)) else x


def _cases() -> list[tuple[str, PackedBatch]]:
    examples = make_examples(6, seed=1)
    return [
        ("6 examples packed into rows of 64", PackedBatch.from_examples(examples, 64, "correct")),
        ("the same 6 examples, one per row (padded)", PackedBatch.from_examples(examples, 64, "padded")),
        ("2 examples packed into rows of 128", PackedBatch.from_examples(examples[:2], 128, "buggy")),
    ]


@check("padding share")
def check_padding_share(fn) -> Feedback:
    """``fn(batch)`` must return padding slots / all B*T slots, as a Python float in [0, 1]."""
    shares = []
    for name, batch in _cases():
        got = _scalar(fn(batch))
        if not isinstance(got, numbers.Real) or isinstance(got, bool):
            return fail(
                f"on {name} your function returned {got!r}, not a number.",
                "return a float, e.g. `padding.sum().item() / padding.numel()`.",
            )
        B, T = batch.shape
        pad = int((~batch.real_mask).sum())
        want = pad / (B * T)
        if math.isclose(got, want, abs_tol=_TOL):
            shares.append(f"{name}: {want:.0%}")
            continue
        real = batch.n_real_tokens
        if math.isclose(got, 1 - want, abs_tol=_TOL):
            return fail(
                f"on {name} you returned {got:.3f}, the share of *real* tokens; padding is {want:.3f}.",
                "padding is where batch.real_mask is False.",
            )
        if math.isclose(got, pad, abs_tol=_TOL):
            return fail(
                f"on {name} you returned the number of padding tokens ({pad}), not a share.",
                f"divide by the number of token slots, B * T = {B} * {T}.",
            )
        if math.isclose(got, 100 * want, abs_tol=100 * _TOL) and want > 0:
            return fail(
                f"on {name} you returned {got:.2f}: a percentage; the share is {want:.4f}.",
                "return a fraction between 0 and 1 (print it with :.0% to show a percentage).",
            )
        if real and math.isclose(got, pad / real, abs_tol=_TOL):
            return fail(
                f"on {name} you divided by the real tokens ({real}); divide by all {B * T} slots.",
                "the share of the batch is padding slots / (B * T).",
            )
        return fail(
            f"on {name} you returned {got:.4f}; the padding share is {want:.4f} "
            f"({pad} of {B * T} slots).",
            "count the slots where batch.real_mask is False and divide by batch.real_mask.numel().",
        )
    return ok("right on every batch. Padding share " + "; ".join(shares) + ".")
