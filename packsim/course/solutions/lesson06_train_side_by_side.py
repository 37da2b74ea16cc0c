"""Reference solutions for notebook 06_train_side_by_side (checks: packsim.course.exercises.lesson06_train_side_by_side)."""

from __future__ import annotations

from statistics import fmean


def em_gap(results) -> float:
    """Isolated exact match of correct minus buggy, each the mean over its seeds."""
    runs = results.by_setup()
    mean = {s: fmean(r.final["isolated_exact_match"] for r in runs[s]) for s in ("correct", "buggy")}
    return mean["correct"] - mean["buggy"]


def warning_sign(results) -> dict:
    """Per setup: response loss of the last training examples alone minus inside their packs (mean over seeds)."""
    return {
        setup: fmean(r.final["train_isolated_response_loss"] - r.final["train_packed_response_loss"] for r in runs)
        for setup, runs in results.by_setup().items()
    }


def fix_share(results) -> dict:
    """Share of the buggy -> correct isolated exact-match gap that each single fix closes."""
    runs = results.by_setup()
    em = {s: fmean(r.final["isolated_exact_match"] for r in rs) for s, rs in runs.items()}
    gap = em["correct"] - em["buggy"]
    return {fix: (em[fix] - em["buggy"]) / gap for fix in ("mask_fix", "loss_fix")}
