"""Forensics from a finished checkpoint: did the run behind these weights let packed examples see each other?

Interview question 2 with only the trained model and a sample of its training examples: a run
whose packs leaked trained the model to read past foreign neighbours, and that habit stays in the
weights. Two measurements read it, on the same examples: the **pack gap** (response loss inside a
causal pack minus alone; small when the run leaked) and the **neighbour influence** (mean |change|
of the loss when the neighbours change). A **control** (same base model and data, padded or packed
correctly) calibrates the verdict: flagged below ``threshold`` times the control's gap; without
one, numbers and no verdict. The two are compared **paired**, example by example
(:meth:`ForensicsReport.paired_gap`: suspect minus control pack gap on the same examples, with a
seeded bootstrap 95% interval), not as two means side by side. Not :func:`packsim.audit`: any model passes an isolated forward, the
leak lived in the run's forward. Examples: ``Example`` objects or ``prompt_ids``/``response_ids``
dicts; per-example losses (N,).

The natural control (:func:`by_position`): the first example of a row never had a neighbour, so
its in-pack loss is its loss alone; rescored in the run's own packer (``strategy``,
``examples_per_step``), the rows are the run's. Which examples sit at a place depends on the
packer (:func:`length_by_place`: BFD opens each row with its longest examples), so loss by place
read from a log alone tests nothing; the gap to each example's loss alone does.

Lessons: 07, 09, A8.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from packsim.core.batch import PackedBatch
from packsim.core.device import model_device
from packsim.core.errors import PacksimError
from packsim.core.packing import pack_arrays
from packsim.core.setups import Setup
from packsim.core.text_table import text_table
from packsim.core.token_example import as_example
from packsim.experiment.evaluation import example_scores

__all__ = ["Evidence", "ForensicsReport", "PairedGap", "measure", "forensics", "flag_comparison", "by_position",
           "length_by_place"]

# The contaminated forward: one causal mask over the pack, positions continuing (preset "loss_fix").
_LEAKY = Setup("causal", "continuous", "completion", name="causal pack")


@dataclass(frozen=True)
class Evidence:
    """What one model's weights show on a sample: losses in nats, means over ``n`` examples;
    ``gaps`` maps each of those examples to its own pack gap, keyed by (its index, its tokens, the
    pack capacity): two models pair only on the same examples scored in the same packs."""

    n: int
    alone_loss: float
    packed_loss: float
    pack_gap: float
    neighbour_influence: float
    gaps: Mapping[tuple, float] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class PairedGap:
    """Suspect minus control pack gap, example by example: the mean over ``n`` shared examples and
    its 95% bootstrap interval [``low``, ``high``] (``resamples`` resamples, seeded)."""

    n: int
    mean: float
    low: float
    high: float
    resamples: int

    def __str__(self) -> str:
        return (f"{self.mean:+.3f} nats, 95% bootstrap interval [{self.low:+.3f}, {self.high:+.3f}] "
                f"over {self.n} examples")


def paired_gap(suspect: Mapping, control: Mapping, resamples: int = 2000,
               seed: int = 0) -> PairedGap | None:
    """Pair two models' per-example pack gaps on the keys both have (None: fewer than 2 shared)."""
    shared = sorted(set(suspect) & set(control))
    if len(shared) < 2:
        return None
    d = np.array([suspect[i] - control[i] for i in shared])  # (n,)
    picks = np.random.default_rng(seed).integers(0, len(d), size=(resamples, len(d)))  # (R, n)
    low, high = np.percentile(d[picks].mean(axis=1), [2.5, 97.5])
    return PairedGap(len(d), float(d.mean()), float(low), float(high), resamples)


@dataclass(frozen=True)
class ForensicsReport:
    """The suspect's evidence, the control's (or None) and the verdict."""

    suspect: Evidence
    control: Evidence | None
    threshold: float

    @property
    def gap_ratio(self) -> float | None:
        """suspect pack gap / control pack gap (None without a control)."""
        if self.control is None:
            return None
        return self.suspect.pack_gap / max(self.control.pack_gap, 1e-9)

    @property
    def flagged(self) -> bool | None:
        """True: the weights read past neighbours far more than the control's (None: uncalibrated)."""
        return None if self.control is None else self.gap_ratio < self.threshold

    def paired_gap(self, resamples: int = 2000, seed: int = 0) -> PairedGap | None:
        """Suspect minus control pack gap on the same examples, with its bootstrap interval (None:
        no control, a control given as :class:`Evidence` without per-example gaps, or one measured
        on other examples or packs: nothing to pair)."""
        if self.control is None:
            return None
        return paired_gap(self.suspect.gaps, self.control.gaps, resamples, seed)

    @property
    def verdict(self) -> str:
        s = self.suspect
        if self.control is None:
            return (f"UNCALIBRATED: pack gap {s.pack_gap:+.3f} nats, neighbour influence "
                    f"{s.neighbour_influence:.3f}; pass a control (the same model trained padded or "
                    "correctly packed) for a verdict.")
        word = "CONTAMINATED" if self.flagged else "CLEAN"
        rel = "below" if self.flagged else "not below"
        return (f"{word}: pack gap {s.pack_gap:+.3f} nats is {self.gap_ratio:.2f}x the control's "
                f"{self.control.pack_gap:+.3f}, {rel} {self.threshold}x: the weights "
                f"{'learned to read past packed neighbours' if self.flagged else 'are disrupted by packed neighbours like the control'}.")

    def table(self) -> str:
        rows = [("", "alone loss", "in-pack loss", "pack gap", "neighbour influence", "examples")]
        for name, e in (("suspect", self.suspect), ("control", self.control)):
            if e is not None:
                rows.append((name, f"{e.alone_loss:.3f}", f"{e.packed_loss:.3f}", f"{e.pack_gap:+.3f}",
                             f"{e.neighbour_influence:.3f}", str(e.n)))
        paired = self.paired_gap()
        tail = [f"paired, suspect minus control pack gap: {paired}"] if paired is not None else []
        return "\n".join([self.verdict, *text_table(rows), *tail])

    def __str__(self) -> str:
        return self.table()


def _examples(examples: Sequence) -> list:
    if isinstance(examples, (Mapping, str, bytes)) or not isinstance(examples, Sequence) or len(examples) < 4:
        raise PacksimError("forensics needs a list of at least 4 training examples (a few hundred "
                           "give stable numbers): packsim Examples or dicts with prompt_ids and response_ids.")
    return [as_example(ex, i, "example") for i, ex in enumerate(examples)]


def _scores(model, examples: list, setup, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N,) response loss per example under ``setup``, and (N,) True for the first example of a row."""
    batch = PackedBatch.from_examples(examples, capacity, setup=setup, strategy="sequential")
    loss, _ = example_scores(model, batch.to(model_device(model)))
    first = torch.zeros(len(examples), dtype=torch.bool)
    first[batch.seq_ids[:, 0].cpu().clamp(min=0)] = True
    return loss.float(), first


@torch.no_grad()
def measure(model, examples: Sequence, capacity: int = 256, seed: int = 0) -> Evidence:
    """Pack gap and neighbour influence of ``model`` on ``examples`` (see the module doc)."""
    exs = _examples(examples)
    longest = max(len(ex.tokens) for ex in exs)
    capacity = max(int(capacity), longest)
    alone, _ = _scores(model, exs, "padded", longest)
    packed, first = _scores(model, exs, _LEAKY, capacity)
    perm = list(range(len(exs)))
    random.Random(seed).shuffle(perm)
    moved, moved_first = _scores(model, [exs[i] for i in perm], _LEAKY, capacity)
    index = torch.tensor(perm)
    other, other_first = torch.empty_like(moved), torch.empty_like(moved_first)
    other[index], other_first[index] = moved, moved_first
    inner = ~first & ~other_first  # a neighbour before it in both arrangements
    if not bool(inner.any()):
        raise PacksimError(f"no example has a neighbour before it in a pack of {capacity} tokens: raise "
                           "capacity or pass more (shorter) examples.")
    gap = packed - alone  # (N,)
    return Evidence(n=int(inner.sum()), alone_loss=float(alone[inner].mean()),
                    packed_loss=float(packed[inner].mean()),
                    pack_gap=float(gap[inner].mean()),
                    neighbour_influence=float((packed - other).abs()[inner].mean()),
                    gaps={_pair_key(exs, int(i), capacity): float(gap[i]) for i in inner.nonzero().flatten()})


def _pair_key(exs: list, i: int, capacity: int) -> tuple:
    """What makes two models' gaps a pair: the same example at the same place of the same sample,
    scored in packs of the same capacity."""
    return i, tuple(int(t) for t in exs[i].tokens), capacity


def forensics(model, examples: Sequence, control=None, *, capacity: int = 256, seed: int = 0,
              threshold: float = 0.5) -> ForensicsReport:
    """Evidence of cross-example contamination in a trained ``model``, calibrated by ``control``.

    Args:
        model: the trained causal LM (packsim's, or a transformers model packsim's forward runs).
        examples: a sample of its training examples (a few hundred).
        control: a model trained the same way but padded or correctly packed, or its
            :class:`Evidence` from :func:`measure`; None gives an uncalibrated report.
        capacity: tokens per pack of the causal-pack scoring; seed: the neighbour shuffle.
        threshold: flagged when suspect pack gap < threshold x control pack gap.
    """
    if not 0 < threshold < 1:
        raise PacksimError(f"threshold={threshold}: use a fraction of the control's pack gap in (0, 1).")
    suspect = measure(model, examples, capacity, seed)
    if control is not None and not isinstance(control, Evidence):
        control = measure(control, examples, capacity, seed)
    return ForensicsReport(suspect, control, threshold)


def flag_comparison(out: str | Path, control_setup: str = "correct", n_examples: int = 256) -> list[dict]:
    """Run forensics on every model of a ``packsim compare --out DIR`` (tasks design).

    Each run's sample is the first ``n_examples`` of its training stream; its control is the
    ``control_setup`` model of another seed (so a control never judges itself). Returns one dict
    per run: setup, seed, control seed, pack gap, control gap, ratio, neighbour influence, flagged.
    """
    from packsim.core.data import make_dataset
    from packsim.experiment.comparison import load_model
    from packsim.experiment.results import Results

    results = Results.load(Path(out) / "results.json")
    if results.config.get("data") != "tasks":
        raise PacksimError(f"flag_comparison reads the tasks design; {out} holds {results.config.get('data')!r}.")
    seeds = sorted({r.seed for r in results.runs if r.setup == control_setup})
    if len(seeds) < 2:
        raise PacksimError(f"{out} needs {control_setup!r} runs of at least 2 seeds (one controls the other): "
                           "run packsim compare --seeds 3.")
    capacity = int(results.config["train"]["capacity"])
    controls: dict[tuple[int, int], Evidence] = {}
    rows = []
    for run in results.runs:
        sample = make_dataset(n_examples, 0, seed=run.seed)[0]
        later = [s for s in seeds if s > run.seed]
        cseed = later[0] if later else next(s for s in seeds if s != run.seed)  # the next seed, cyclically
        key = (cseed, run.seed)
        if key not in controls:
            controls[key] = measure(load_model(out, control_setup, cseed), sample, capacity)
        report = forensics(load_model(out, run.setup, run.seed), sample, controls[key], capacity=capacity)
        rows.append({"setup": run.setup, "seed": run.seed, "control_seed": cseed,
                     "pack_gap": report.suspect.pack_gap, "control_gap": report.control.pack_gap,
                     "ratio": report.gap_ratio, "neighbour_influence": report.suspect.neighbour_influence,
                     "control_influence": report.control.neighbour_influence, "flagged": report.flagged})
    return rows


_WHOLE = ("sequential", "ffd", "bfd")  # packers that keep every example whole: one place each


def _chunks(items: Sequence, examples_per_step: int | None) -> list:
    if examples_per_step is None:
        return [items]
    if isinstance(examples_per_step, bool) or not isinstance(examples_per_step, int) or examples_per_step < 1:
        raise PacksimError(f"examples_per_step={examples_per_step!r}: pass the run's examples per step "
                           "(an int >= 1), or None to pack the sample in one go.")
    return [items[i : i + examples_per_step] for i in range(0, len(items), examples_per_step)]


def length_by_place(lengths, capacity: int, strategy: str = "bfd",
                    examples_per_step: int | None = None) -> dict[int, dict]:
    """Mean example length by place in the row: what a loss-by-place reading must hold equal.

    ``lengths`` (N,) packed by ``strategy`` into rows of ``capacity`` tokens, ``examples_per_step``
    at a time as a training loop packs each step's examples (None: all at once). Returns
    ``{place: {"n", "mean_length"}}`` (place 1 = first piece of its row; the length is its whole
    example's). Under ``bfd`` / ``ffd`` the longest examples open the rows; under ``sequential`` the
    first place holds the example the previous row could not take, under ``wrapped`` the example
    the cut fell in: both longer than the mean (a long example is likelier to straddle a cut).
    """
    counts, sums = np.zeros(1, dtype=np.int64), np.zeros(1)  # indexed by place (0 unused)
    for chunk in _chunks(np.asarray(lengths), examples_per_step):
        packs = pack_arrays(chunk, capacity, strategy)
        starts = np.repeat(packs.row_offsets[:-1], np.diff(packs.row_offsets))  # (pieces,) its row's first piece
        place = np.arange(packs.n_pieces) - starts + 1  # (pieces,)
        size = packs.example_lengths[packs.index]  # (pieces,) the whole example's length
        n, total = np.bincount(place), np.bincount(place, weights=size)
        counts, sums = (np.pad(a, (0, max(0, len(n) - len(a)))) for a in (counts, sums))
        counts[: len(n)] += n
        sums[: len(n)] += total
    return {int(k): {"n": int(counts[k]), "mean_length": float(sums[k] / counts[k])} for k in np.nonzero(counts)[0]}


@torch.no_grad()
def by_position(model, examples: Sequence, capacity: int = 256, setup=_LEAKY, strategy: str = "sequential",
                examples_per_step: int | None = None) -> dict[int, dict]:
    """The run's natural control: response loss by an example's place in its pack, in the pack and alone.

    The first example of every row has nothing before it, in training as here, so under a causal
    pack (the leaky forward, the default ``setup``) its loss equals its loss alone. Later places sit
    after neighbours. ``examples`` are packed by ``strategy`` (``sequential``, ``ffd`` or ``bfd``;
    ``wrapped`` cuts examples, so an example has no one place) into rows of ``capacity`` tokens,
    ``examples_per_step`` at a time as the training loop packs each step (None: all at once): pass
    the run's own ``strategy`` and ``examples_per_step`` and the rows are the run's. Returns
    ``{place: {"n", "alone", "packed", "gap"}}`` (place 1 = first in its row; mean response losses
    in nats; gap = packed - alone). A model that never saw neighbours in training shows a gap that
    jumps after place 1; one trained on leaky packs barely moves. Under the run's own ``setup`` the
    ``packed`` column is what a per-example log would hold; read alone it is no test, since which
    examples sit at a place depends on the packer (:func:`length_by_place`), and ``alone`` (a
    forward per example) is what it needs beside it.
    """
    if strategy not in _WHOLE:
        raise PacksimError(f"by_position scores whole examples: strategy={strategy!r} must be one of "
                           f"{list(_WHOLE)} ('wrapped' cuts examples across rows).")
    exs = _examples(examples)
    longest = max(len(ex.tokens) for ex in exs)
    capacity = max(int(capacity), longest)
    alone, _ = _scores(model, exs, "padded", longest)
    packed = torch.empty(len(exs))
    place = torch.zeros(len(exs), dtype=torch.long)
    offset = 0
    for chunk in _chunks(exs, examples_per_step):
        batch = PackedBatch.from_examples(chunk, capacity, setup=setup, strategy=strategy)
        scores, _ = example_scores(model, batch.to(model_device(model)))
        packed[offset : offset + len(chunk)] = scores.float().cpu()
        seen: dict[int, int] = {}
        for seg in batch.segments:  # row-major: the k-th segment of a row is at place k
            seen[seg.row] = seen.get(seg.row, 0) + 1
            place[offset + seg.example] = seen[seg.row]
        offset += len(chunk)
    out = {}
    for k in sorted(set(place.tolist())):
        at = place == k
        out[k] = {"n": int(at.sum()), "alone": float(alone[at].mean()), "packed": float(packed[at].mean()),
                  "gap": float((packed - alone)[at].mean())}
    return out
