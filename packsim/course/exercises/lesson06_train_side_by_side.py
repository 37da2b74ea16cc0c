"""Checks for the exercises of notebook 06_train_side_by_side (solutions: packsim.course.solutions.lesson06_train_side_by_side).

- :func:`check_em_gap`: ``em_gap(results) -> float``, correct minus buggy isolated exact match,
  each the mean over seeds;
- :func:`check_warning_sign`: ``warning_sign(results) -> dict``, per setup the mean over seeds
  of (response loss of the last training examples run alone) - (the same, inside their packs);
- :func:`check_fix_share`: ``fix_share(results) -> dict``, the share of the buggy-to-correct
  exact-match gap each single fix closes.

The oracle is :meth:`packsim.Results.summary` on hand-built :class:`~packsim.experiment.results.Results`
whose seeds disagree (so "seed 0 only", "median" or "max" give different numbers) and whose runs
are listed in an unusual order; then the committed-style numbers of a second hand-built case.
Only the values are judged: any formula (a mean of differences or a difference of means,
``Results.summary``), a float, a 0-d tensor or a numpy scalar, within 5e-5 (4 decimals) of the
oracle; ``fix_share`` may also carry the two ends of its scale, ``buggy`` 0 and ``correct`` 1.
"""

from __future__ import annotations

import numbers
import statistics

from packsim.course.exercises import Feedback, check, fail, ok
from packsim.experiment.results import Results, RunResult

__all__ = ["check_em_gap", "check_warning_sign", "check_fix_share", "toy_results"]

_TOL = 5e-5  # 4 decimals; the slips named below are 0.003 or more away on these tables


def _run(setup: str, seed: int, **final) -> RunResult:
    return RunResult(setup=setup, seed=seed, data="tasks", final=dict(final))


def toy_results(case: int = 0) -> Results:
    """Hand-built results (no training): 3 seeds per setup that disagree, runs in shuffled order.

    ``case`` 0 and 1 use different numbers. Final keys: ``isolated_exact_match``,
    ``reported_loss``, ``isolated_response_loss``, ``train_packed_response_loss``,
    ``train_isolated_response_loss``.
    """
    table = {  # setup -> per seed (isolated EM, reported, isolated resp, train packed, train alone)
        0: {
            "correct": [(0.81, 0.12, 0.20, 0.30, 0.31), (0.70, 0.15, 0.30, 0.35, 0.35), (0.78, 0.10, 0.22, 0.28, 0.30)],
            "buggy": [(0.30, 1.10, 1.05, 0.70, 1.10), (0.31, 1.20, 1.20, 0.80, 1.00), (0.38, 1.05, 0.95, 0.60, 1.30)],
            "mask_fix": [(0.74, 1.02, 0.27, 0.40, 0.41), (0.76, 1.03, 0.25, 0.38, 0.40), (0.79, 1.01, 0.29, 0.42, 0.42)],
            "loss_fix": [(0.24, 0.95, 1.00, 0.75, 1.05), (0.33, 0.90, 1.04, 0.90, 1.00), (0.29, 1.00, 1.02, 0.65, 1.15)],
        },
        1: {
            "buggy": [(0.10, 0.40, 0.90, 0.30, 0.95), (0.20, 0.45, 0.88, 0.35, 0.90), (0.12, 0.47, 0.91, 0.20, 1.00)],
            "correct": [(0.14, 0.83, 0.90, 0.80, 0.82), (0.35, 0.54, 0.51, 0.50, 0.55), (0.26, 0.67, 0.66, 0.60, 0.66)],
            "loss_fix": [(0.11, 0.70, 0.89, 0.50, 0.90), (0.13, 0.72, 0.87, 0.45, 0.85), (0.16, 0.69, 0.92, 0.40, 0.93)],
            "mask_fix": [(0.22, 0.95, 0.70, 0.66, 0.67), (0.30, 0.90, 0.62, 0.61, 0.63), (0.25, 0.99, 0.68, 0.70, 0.70)],
        },
    }[case]
    runs = []
    for seed in (2, 0, 1):  # seeds not in order: "the first run" is not seed 0
        for setup, rows in table.items():
            em, rep, iso, tp, ti = rows[seed]
            runs.append(_run(setup, seed, isolated_exact_match=em, reported_loss=rep, isolated_response_loss=iso,
                             train_packed_response_loss=tp, train_isolated_response_loss=ti))
    return Results(runs=runs, config={"data": "tasks", "seeds": [0, 1, 2]})


def _mean(results: Results, setup: str, key: str) -> float:
    return results.summary(key)[setup]["mean"]


def _values(results: Results, setup: str, key: str) -> list[float]:
    return [r.final[key] for r in results.by_setup()[setup]]


def _is_number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _scalar(x):
    """``x`` as a Python number when it holds one value (a 0-d or one-element tensor / numpy array)."""
    size = x.numel() if callable(getattr(x, "numel", None)) else getattr(x, "size", None)
    return x.item() if size == 1 and callable(getattr(x, "item", None)) else x


# --- exercise 1: the isolated exact-match gap -------------------------------------------------


@check("isolated exact-match gap, correct - buggy")
def check_em_gap(em_gap) -> Feedback:
    """``em_gap(results)`` on two hand-built Results; the oracle is ``Results.summary``."""
    for case in (0, 1):
        res = toy_results(case)
        got = _scalar(em_gap(res))
        want = _mean(res, "correct", "isolated_exact_match") - _mean(res, "buggy", "isolated_exact_match")
        if not _is_number(got):
            return fail(f"em_gap returned {got!r} ({type(got).__name__}), not a number.",
                        "return one float: mean over seeds of correct minus mean over seeds of buggy.")
        got = float(got)
        if abs(got - want) <= _TOL:
            continue
        fb = _em_gap_mistake(res, got, want)
        if fb is not None:
            return fb
        return fail(f"on toy_results({case}) em_gap returned {got:.4f}, expected {want:.4f}.",
                    "group the runs by setup (results.by_setup()), average final['isolated_exact_match'] "
                    "over each setup's seeds, then subtract buggy from correct.")
    return ok(f"correct - buggy, each averaged over seeds (e.g. {want:+.4f} on toy_results(1)). "
              "Run it on the committed runs below.")


def _em_gap_mistake(res: Results, got: float, want: float) -> Feedback | None:
    key = "isolated_exact_match"
    c, b = _values(res, "correct", key), _values(res, "buggy", key)
    seed0 = {r.setup: r.final[key] for r in res.runs if r.seed == 0}
    first = {}
    for r in res.runs:
        first.setdefault(r.setup, r.final[key])
    guesses = [
        (-want, "you subtracted the wrong way round (buggy - correct)",
         "the gap is correct minus buggy: positive when correct is better."),
        (100 * want, "you returned percentage points", "return a fraction (0.43), not percent (43)."),
        (seed0["correct"] - seed0["buggy"], "you used seed 0 only", "average over every seed of each setup."),
        (first["correct"] - first["buggy"], "you used the first run of each setup only",
         "average over every seed of each setup."),
        (statistics.median(c) - statistics.median(b), "you took the median over seeds", "take the mean."),
        (max(c) - max(b), "you took the best seed of each setup", "take the mean over seeds."),
        (statistics.fmean(c + b), "you averaged correct and buggy together", "subtract the two means."),
    ]
    for value, what, hint in guesses:
        if abs(got - value) <= _TOL:
            return fail(f"em_gap returned {got:.4f}, expected {want:.4f}: {what}.", hint)
    return None


# --- exercise 2: the warning sign ---------------------------------------------------------------


@check("warning sign: in-pack vs alone")
def check_warning_sign(warning_sign) -> Feedback:
    """``warning_sign(results) -> {setup: mean(train_isolated - train_packed)}``."""
    for case in (0, 1):
        res = toy_results(case)
        got = warning_sign(res)
        want = {s: _mean(res, s, "train_isolated_response_loss") - _mean(res, s, "train_packed_response_loss")
                for s in res.setups()}
        if not isinstance(got, dict):
            return fail(f"warning_sign returned a {type(got).__name__}, not a dict.",
                        "return {setup name: gap} with one entry per setup.")
        got = {k: _scalar(v) for k, v in got.items()}
        if set(got) != set(want):
            return fail(f"warning_sign returned keys {sorted(got)}, expected every setup {sorted(want)}.",
                        "loop over results.by_setup() (or results.setups()).")
        bad = [s for s in want if not _is_number(got[s])]
        if bad:
            return fail(f"the value for {bad[0]!r} is {got[bad[0]]!r}, not a number.", "one float per setup.")
        wrong = [s for s in want if abs(float(got[s]) - want[s]) > _TOL]
        if not wrong:
            continue
        s = wrong[0]
        g, w = float(got[s]), want[s]
        guesses = [
            (-w, "you subtracted the wrong way round", "alone minus in pack: positive when the pack helps."),
            (_mean(res, s, "isolated_response_loss") - _mean(res, s, "reported_loss"),
             "you used the held-out isolated loss and the reported loss",
             "the reported loss counts prompt tokens under an all-token loss, and held-out examples are "
             "not the training examples: compare the SAME training examples, response tokens only "
             "(train_isolated_response_loss - train_packed_response_loss)."),
            (_mean(res, s, "train_isolated_response_loss") - _mean(res, s, "reported_loss"),
             "you compared with the reported loss",
             "the reported loss may count prompt tokens: use train_packed_response_loss."),
            (_mean(res, s, "isolated_response_loss") - _mean(res, s, "train_packed_response_loss"),
             "you used the held-out isolated loss", "use the same training examples run alone: "
             "train_isolated_response_loss."),
        ]
        for value, what, hint in guesses:
            if abs(g - value) <= _TOL:
                return fail(f"on toy_results({case}), {s!r} gives {g:.4f}, expected {w:.4f}: {what}.", hint)
        return fail(f"on toy_results({case}), {s!r} gives {g:.4f}, expected {w:.4f}.",
                    "per setup: mean over seeds of final['train_isolated_response_loss'] - "
                    "final['train_packed_response_loss'].")
    return ok("alone minus in pack, per setup: a large positive gap means the model leans on its neighbours.")


# --- exercise 3: which fix matters most --------------------------------------------------------


@check("share of the gap each fix closes")
def check_fix_share(fix_share) -> Feedback:
    """``fix_share(results) -> {"mask_fix": f, "loss_fix": f}``, f = (em[fix] - em[buggy]) / (em[correct] - em[buggy])."""
    for case in (0, 1):
        res = toy_results(case)
        got = fix_share(res)
        em = {s: _mean(res, s, "isolated_exact_match") for s in res.setups()}
        span = em["correct"] - em["buggy"]
        want = {f: (em[f] - em["buggy"]) / span for f in ("mask_fix", "loss_fix")}
        if not isinstance(got, dict):
            return fail(f"fix_share returned a {type(got).__name__}, not a dict.",
                        "return {'mask_fix': share, 'loss_fix': share}.")
        got = {k: _scalar(v) for k, v in got.items()}
        ends = {"buggy": 0.0, "correct": 1.0}  # a comprehension over every setup also gives these: fine
        if all(k in got and _is_number(got[k]) and abs(got[k] - v) <= _TOL for k, v in ends.items()):
            got = {k: v for k, v in got.items() if k not in ends}
        if set(got) != set(want):
            return fail(f"fix_share returned keys {sorted(got)}, expected ['loss_fix', 'mask_fix'].",
                        "one entry per single fix; buggy and correct are the two ends of the scale.")
        for f in want:
            if not _is_number(got[f]):
                return fail(f"the value for {f!r} is {got[f]!r}, not a number.", "one float per fix.")
            g, w = float(got[f]), want[f]
            if abs(g - w) <= _TOL:
                continue
            if abs(g - (em[f] - em["buggy"])) <= _TOL:
                return fail(f"on toy_results({case}), {f!r} gives {g:.4f}, expected {w:.4f}: you returned "
                            "the raw gain in exact match.", "divide by the whole gap, em[correct] - em[buggy].")
            if abs(g - (em["correct"] - em[f]) / span) <= _TOL:
                return fail(f"on toy_results({case}), {f!r} gives {g:.4f}, expected {w:.4f}: that is the "
                            "share still missing after the fix.", "measure from buggy: (em[fix] - em[buggy]) / gap.")
            if abs(g - 100 * w) <= 1e-4:
                return fail(f"on toy_results({case}), {f!r} gives {g:.4f}: percent, not a fraction.",
                            "return a fraction (1.0 = the fix alone closes the whole gap).")
            fb = _fix_share_mistake(res, f, g, w, em)
            if fb is not None:
                return fb
            return fail(f"on toy_results({case}), {f!r} gives {g:.4f}, expected {w:.4f}: "
                        f"{_fix_share_off(g, w, em, f)}",
                        "(mean em[fix] - mean em[buggy]) / (mean em[correct] - mean em[buggy]), means over seeds.")
    return ok("fix shares measured from buggy (0) to correct (1): a share near 1 is the fix that matters.")


def _fix_share_mistake(res: Results, fix: str, got: float, want: float, em: dict) -> Feedback | None:
    """Name the usual slips of ``fix_share`` by recomputing each one."""
    key = "isolated_exact_match"
    other = "loss_fix" if fix == "mask_fix" else "mask_fix"
    seeds = {s: {r.seed: r.final[key] for r in res.by_setup()[s]} for s in ("buggy", "correct", fix)}
    per_seed = [(seeds[fix][k] - seeds["buggy"][k]) / (seeds["correct"][k] - seeds["buggy"][k])
                for k in seeds["buggy"] if seeds["correct"][k] != seeds["buggy"][k]]
    med = {s: statistics.median(_values(res, s, key)) for s in ("buggy", "correct", fix)}
    s0 = {s: seeds[s][0] for s in seeds}
    span = em["correct"] - em["buggy"]
    guesses = [
        ((em[other] - em["buggy"]) / span, f"that is the share of {other!r}: the two keys are swapped",
         "the value under 'mask_fix' is the mask fix's share, the one under 'loss_fix' the loss fix's."),
        (statistics.fmean(per_seed), "you averaged the per-seed shares (a mean of ratios)",
         "average exact match over seeds first, then take one ratio of the means: a seed with a small "
         "buggy-to-correct gap makes its own ratio explode."),
        ((med[fix] - med["buggy"]) / (med["correct"] - med["buggy"]), "you took medians over seeds",
         "take the mean over seeds of each setup."),
        ((s0[fix] - s0["buggy"]) / (s0["correct"] - s0["buggy"]), "you used seed 0 only",
         "average over every seed of each setup."),
        (em[fix] / em["correct"], "you divided the fix's exact match by correct's",
         "measure both from buggy: (em[fix] - em[buggy]) / (em[correct] - em[buggy]); a fix that does "
         "nothing must give 0, not em[buggy] / em[correct]."),
        ((em[fix] - em["buggy"]) / em["correct"], "you divided by correct's exact match, not by the gap",
         "the denominator is the whole gap, em[correct] - em[buggy]."),
        ((em[fix] - em["buggy"]) / em["buggy"], "you returned the relative gain over buggy",
         "the denominator is the whole gap, em[correct] - em[buggy]."),
    ]
    for value, what, hint in guesses:
        if abs(got - value) <= _TOL:
            return fail(f"{fix!r} gives {got:.4f}, expected {want:.4f}: {what}.", hint)
    return None


def _fix_share_off(got: float, want: float, em: dict, fix: str) -> str:
    """One clause on how an unrecognised answer is off: sign, scale, or size."""
    if (got < 0) != (want < 0):
        return ("the sign is wrong: measure from buggy, so a fix that helps gives a positive share "
                f"(em[{fix}] - em[buggy] = {em[fix] - em['buggy']:+.4f}, gap {em['correct'] - em['buggy']:+.4f}).")
    if abs(want) > 1e-9 and abs(got / want - 1) < 0.05:
        return "close but not equal: use the plain mean over seeds of each setup, no rounding or weighting."
    return ("the value matches no usual slip: check that numerator and denominator both start at buggy "
            f"(means over seeds: buggy {em['buggy']:.4f}, {fix} {em[fix]:.4f}, correct {em['correct']:.4f}).")
