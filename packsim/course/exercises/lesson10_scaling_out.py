"""Checks for the exercises of notebook 10_scaling_out.

- :func:`check_global_loss`: summed token losses and counted targets of R ranks x M micro-batches
  (two ``(R, M)`` tensors) -> the step's loss, every counted token weighing the same;
- :func:`check_backward_scale`: counted targets ``(R, M)`` -> the factor each rank multiplies a
  micro-batch's summed token loss by before ``backward()``, knowing that DistributedDataParallel
  *averages* gradients over the R ranks.

The checks compare with :mod:`packsim.scaling.normalisation` on hand-built tables: unequal
counts between ranks and between micro-batches, a micro-batch with no counted target, and a step
with none at all, so the usual shortcuts (mean of means, per-rank count, forgetting DDP's average)
fail with a message that names them. Only values are judged: a loss may be a float, a 0-d tensor
or a numpy scalar within 1e-6 relative or 5e-5 absolute (4 decimals); factors any (R, M)-shaped,
broadcastable or scalar numbers within 1e-6 relative, any finite value where a micro-batch counts
nothing (its sum is 0).
"""

from __future__ import annotations

import math

import torch

from packsim.course.exercises import Feedback, check, fail, ok
from packsim.scaling.normalisation import backward_scales, objective

__all__ = ["check_global_loss", "check_backward_scale", "TABLES", "table"]

# (counts per rank x micro-batch) the checks try; the last rows hold empty micro-batches
TABLES: tuple[tuple[tuple[int, ...], ...], ...] = (
    ((3, 1), (2, 6)),
    ((5, 5, 2),),
    ((4,), (9,), (1,)),
    ((7, 0), (2, 3)),
    ((0, 0), (0, 0)),
)


def table(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sums, counts) of case ``i``: both (R, M); sums are float64, counts int64."""
    counts = torch.tensor(TABLES[i], dtype=torch.long)
    gen = torch.Generator().manual_seed(i)
    sums = counts.to(torch.float64) * (1 + 3 * torch.rand(counts.shape, dtype=torch.float64, generator=gen))
    return sums, counts


def _value(got) -> float | None:
    try:
        return float(got)
    except (TypeError, ValueError, RuntimeError):
        return None


@check("global loss over ranks x micro-batches")
def check_global_loss(fn) -> Feedback:
    """``fn(sums (R, M), counts (R, M)) -> scalar``: all token losses / all counted targets (0 if none)."""
    for i, rows in enumerate(TABLES):
        sums, counts = table(i)
        where = f"for counts {[list(r) for r in rows]} (ranks x micro-batches)"
        value = _value(fn(sums.clone(), counts.clone()))
        if value is None:
            return fail(f"{where} you returned something that is not a number.", "return a float or a 0-d tensor.")
        want = float(objective(sums, counts, "global"))
        if math.isclose(value, want, rel_tol=1e-6, abs_tol=5e-5):  # the slips below are >= 0.04 away
            continue
        if math.isnan(value):
            return fail(f"{where} you returned nan: 0 counted targets divided by 0.",
                        "a micro-batch (or a whole step) can hold no response token: return 0 when the "
                        "total count is 0, and never divide a micro-batch by its own count.")
        for kind, text in (("mean", "the mean of the per-micro-batch means"), ("local", "the mean over ranks "
                           "of each rank's per-token mean")):
            if math.isclose(value, float(objective(sums, counts, kind)), rel_tol=1e-6):
                return fail(f"{where} you returned {text} ({value:.4f}); the per-token loss is {want:.4f}.",
                            "tokens in a rank or micro-batch with few targets weigh more that way: add all "
                            "the sums, add all the counts, divide once.")
        if math.isclose(value, float(sums.sum()), rel_tol=1e-6):
            return fail(f"{where} you returned the sum of the token losses, not normalised.",
                        "divide by the total number of counted targets over all ranks and micro-batches.")
        return fail(f"{where} you returned {value:.4f}, expected {want:.4f}.",
                    "sum(sums) / sum(counts) over both dimensions, 0 when nothing is counted.")
    return ok("right: every response token weighs the same, on whatever rank and in whatever micro-batch it "
              "landed; that is what one process with the whole batch computes.")


@check("the factor before backward() under DDP")
def check_backward_scale(fn) -> Feedback:
    """``fn(counts (R, M)) -> (R, M)``: R / total count where counts > 0 (DDP divides gradients by R)."""
    for i, rows in enumerate(TABLES):
        _, counts = table(i)
        R = counts.shape[0]
        where = f"for counts {[list(r) for r in rows]} (ranks x micro-batches)"
        got = fn(counts.clone())
        try:
            got = torch.as_tensor(got, dtype=torch.float64).expand(counts.shape)
        except (TypeError, RuntimeError, ValueError):
            return fail(f"{where} you returned {type(got).__name__}, not a number or an (R, M) tensor.",
                        "return a tensor shaped like counts (or one number for all of it).")
        want = backward_scales(counts, "global")  # (R, M)
        used = counts > 0  # an empty micro-batch's sum is 0: any finite factor is right there
        if bool(torch.isfinite(got).all()) and torch.allclose(got[used], want[used], rtol=1e-6, atol=0):
            continue
        if not bool(torch.isfinite(got[used]).all()) or not bool(torch.isfinite(got).all()):
            return fail(f"{where} your factors hold inf or nan.",
                        "when the total count is 0 nothing is counted: return zeros, not 1/0.")
        if torch.allclose(got[used], (want / R)[used], rtol=1e-6):
            return fail(f"{where} you returned 1 / total: right for one process, but DDP then divides the "
                        f"gradient by the {R} ranks, so it comes out {R}x too small.",
                        "multiply by the number of ranks (counts.shape[0]) to undo DDP's average.")
        per_rank = counts.sum(dim=1, keepdim=True).double().clamp(min=1).expand(counts.shape)
        if R > 1 and torch.allclose(got[used], (1 / per_rank)[used], rtol=1e-6):
            return fail(f"{where} you divided by each rank's own count: that is average_tokens_across_devices="
                        "False, and ranks with fewer targets weigh more.",
                        "every rank divides by the same total, summed over all ranks.")
        return fail(f"{where} your factors are {got.tolist()}, expected {want.tolist()}.",
                    "factor = number of ranks / total counted targets over ranks and micro-batches.")
    return ok("right: R / N_total on every rank; after DDP's average the gradient is that of the one-process "
              "per-token loss (what the Trainer does with average_tokens_across_devices=True).")
