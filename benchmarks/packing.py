"""Benchmark 1: packing quality and speed, packsim wrapped / FFD / BFD vs TRL's ``pack_dataset``.

Feeds notebook 01 (why pack) and the README. For each length mix, size and capacity, every
packer packs the same lengths, side by side in one run, ``--repeats`` rounds in rotating order.
Reported: packs used, fill ratio, gap to the lower bound ``ceil(total / capacity)``, time
(median [min-max] over the rounds) and the packsim/TRL time ratio (paired per round)::

    python benchmarks/packing.py            # 10k / 100k / 1M lengths x capacities 512 / 2048 / 8192
                                            # (bimodal mix: 100k / 300k / 1M)
    python benchmarks/packing.py --quick    # 10k lengths only, well under a minute
    python benchmarks/packing.py --packers wrapped,trl_wrapped,trl_wrapped_1batch --merge
                                            # rerun some packers, keep the others' rows in the JSON

TRL is optional (``pip install -e '.[bench]'``); without it the TRL columns are skipped and the
script says so.

What is timed, exactly:

- packsim ``ffd`` / ``bfd``: ``packsim.pack(lengths, capacity, strategy, overflow="truncate")``:
  which example goes in which row, from the lengths alone, as Python lists of entries (what
  ``PackedBatch.from_examples`` uses); ``bfd_split`` is ``pack(..., "bfd", overflow="split")``.
- packsim ``wrapped``: ``packsim.pack_arrays(lengths, capacity, "wrapped")``: the same packs as
  numpy arrays (per piece: example, start, length; per row: offsets), the like-for-like product
  with TRL's ``wrapped``, whose result is new Arrow offsets over the same token column. Its row
  in the JSON also holds, under ``"lists"``, the time of ``packsim.pack(lengths, capacity,
  "wrapped")`` (the same packs as Python lists of ints and Pieces), timed in the same rounds,
  with its own ratios to TRL; the printed table shows it as the row ``wrapped (lists)``.
- TRL: ``trl.pack_dataset(dataset, capacity, strategy)`` on a ``datasets.Dataset`` with one int8
  token column built beforehand (not timed). It computes the same assignment and also moves the
  token data (an Arrow ``take``; cheap at one byte per token). ``trl_bfd`` / ``trl_wrapped`` use
  ``datasets``' default map batch of 1000 examples, which is how ``SFTTrainer`` calls it: every
  batch of 1000 examples is packed on its own. ``trl_bfd_1batch`` / ``trl_wrapped_1batch`` pass
  ``map_kwargs={"batch_size": None}``: one global packing, as packsim does.

- bare numpy, timed beside packsim ``wrapped`` in the same rounds (its row's ``"numpy"``):
  ``cumsum`` is ``np.cumsum(lengths)``, the one pass over the lengths wrapped packing cannot do
  without; ``write`` is ``np.ones`` of int64 filling as many bytes as ``pack_arrays``' piece
  arrays and row offsets hold (3 values per piece, 1 per row + 1, int32 where they fit, so
  half the bytes of int64 then), writing that result's bytes once (fresh pages only where the
  allocator cannot hand back the previous round's memory: the largest outputs). The column
  ``packsim/bare numpy`` gives packsim's time over each, per round.

Ratios are median [min-max] of the per-round ratios (each round times every packer once, in
an order that rotates from round to round); ``load`` is the 1-minute load average as the
configuration starts (the machine is shared: read the ratios, not the seconds).

Both BFDs truncate examples longer than the capacity (TRL's ``bfd`` does; packsim gets
``overflow="truncate"``), so they place exactly the same tokens; ``wrapped`` cuts instead.
``bfd_split`` (packsim) and TRL's ``bfd_split`` cut each example longer than the capacity into
capacity-sized chunks and pack every chunk; they run only where some example is longer than the
capacity (elsewhere they are BFD).

``--packers wrapped,trl_wrapped,trl_wrapped_1batch`` runs a subset. With ``--merge`` the rows of
the packers not run are kept from the ``packing.json`` already in the output folder (the JSON's
``merged_from`` records that run's command, machine and load), so a subset can be refreshed
without losing the rest; run a packsim packer together with its TRL counterparts, since each
ratio is paired within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import benchutil as bu
import numpy as np

import packsim
from packsim.core.data import long_tailed_lengths, uniform_lengths
from packsim.core.pack_stats import packing_stats

# packer name -> (packsim strategy, overflow policy)
PACKSIM = {"wrapped": ("wrapped", "truncate"), "ffd": ("ffd", "truncate"), "bfd": ("bfd", "truncate"),
           "bfd_split": ("bfd", "split")}
# packsim packers timed as pack_arrays (compared with TRL); pack(), the lists, is timed too as "lists"
ARRAYS = {"wrapped"}
# name -> (TRL strategy, map_kwargs)
TRL_PACKERS = {
    "trl_bfd": ("bfd", {}),
    "trl_bfd_1batch": ("bfd", {"batch_size": None}),
    "trl_bfd_split": ("bfd_split", {}),
    "trl_bfd_split_1batch": ("bfd_split", {"batch_size": None}),
    "trl_wrapped": ("wrapped", {}),
    "trl_wrapped_1batch": ("wrapped", {"batch_size": None}),
}
SPLIT = {"bfd_split", "trl_bfd_split", "trl_bfd_split_1batch"}  # only where an example overflows
SMALL_N = 10_000  # up to this many lengths a call takes milliseconds: 2 * repeats + 1 rounds
# packsim strategy -> the TRL packers its time is compared with (SFTTrainer batching, one batch)
COUNTERPART = {
    "wrapped": ("trl_wrapped", "trl_wrapped_1batch"),
    "ffd": ("trl_bfd", "trl_bfd_1batch"),  # TRL has no FFD: compared with its BFD
    "bfd": ("trl_bfd", "trl_bfd_1batch"),
    "bfd_split": ("trl_bfd_split", "trl_bfd_split_1batch"),
}
MIXES = {
    "long_tailed": "lognormal, median 90, sigma 1.0, clipped to [1, 2048] (packsim.core.data.long_tailed_lengths)",
    "uniform": "uniform on [1, 512] (packsim.core.data.uniform_lengths)",
    "bimodal": "75% lognormal(4.4, 0.7), 25% lognormal(6.5, 0.6), rounded, clipped to [2, 4096] (issue 24)",
}
# the bare-numpy references timed beside packsim wrapped in the same rounds (see the docstring)
NUMPY_REFS = ("cumsum", "write")


# ------------------------------------------------------------------------------ inputs


def make_lengths(mix: str, n: int, seed: int = 0) -> np.ndarray:
    """Example lengths (n,) int64 of a mix in :data:`MIXES`."""
    if mix == "long_tailed":
        return long_tailed_lengths(n, median=90, sigma=1.0, max_len=2048, min_len=1, seed=seed)
    if mix == "uniform":
        return uniform_lengths(n, 1, 512, seed=seed)
    if mix == "bimodal":
        rng = np.random.default_rng(seed)
        short, long = rng.lognormal(4.4, 0.7, n), rng.lognormal(6.5, 0.6, n)
        return np.clip(np.rint(np.where(rng.random(n) < 0.75, short, long)), 2, 4096).astype(np.int64)
    raise ValueError(f"unknown mix {mix!r}; use one of {sorted(MIXES)}")


def trl_status() -> tuple[bool, str]:
    """(importable, version or why not) for TRL's ``pack_dataset`` and ``datasets``."""
    try:
        import trl  # before datasets: fails fast when TRL is missing
        from trl import pack_dataset  # noqa: F401
    except Exception as err:  # ImportError, or a broken install raising something else
        return False, f"{type(err).__name__}: {err}"
    import datasets  # a dependency of TRL

    datasets.disable_progress_bars()
    return True, f"trl {trl.__version__}, datasets {datasets.__version__}"


def token_dataset(lengths: np.ndarray):
    """A ``datasets.Dataset`` with one ``input_ids`` column: example i is ``lengths[i]`` int8 zeros."""
    import pyarrow as pa
    from datasets import Dataset
    from datasets.table import InMemoryTable

    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = pa.array(np.zeros(int(offsets[-1]), dtype=np.int8))
    column = pa.LargeListArray.from_arrays(pa.array(offsets), values)
    return Dataset(InMemoryTable(pa.table({"input_ids": column})))


# ------------------------------------------------------------------------------ one packer


def packsim_stats(lengths: np.ndarray, packs, capacity: int) -> dict:
    """Rows used, tokens placed, lower bound, fill and gap of packsim packs."""
    s = packing_stats(lengths, packs, capacity)
    return {
        "packs": s.n_packs,
        "tokens": s.total_tokens,
        "lower_bound": s.lower_bound,
        "fill": s.fill_ratio,
        "gap": s.gap_to_lower_bound,
    }


def trl_stats(packed, capacity: int) -> dict:
    """The same numbers for a TRL packed dataset (row length = tokens in the row)."""
    import pyarrow.compute as pc

    table = packed.with_format("arrow")[:]
    row_len = pc.list_value_length(table["input_ids"]).to_numpy()
    if row_len.size and int(row_len.max()) > capacity:
        raise RuntimeError(f"TRL produced a row of {int(row_len.max())} > {capacity} tokens")
    total, rows = int(row_len.sum()), len(row_len)
    lb = -(-total // capacity)
    return {
        "packs": rows,
        "tokens": total,
        "lower_bound": lb,
        "fill": total / (rows * capacity) if rows else 0.0,
        "gap": rows / lb - 1 if lb else 0.0,
    }


def numpy_call(form: str, lengths: np.ndarray, capacity: int):
    """The bare-numpy reference ``form`` (:data:`NUMPY_REFS`) for packsim wrapped on these lengths.

    ``cumsum``: ``np.cumsum(lengths)``, the one pass over the lengths wrapped packing needs at
    least; ``write``: ``np.ones`` of int64 filling as many bytes as ``pack_arrays``' piece arrays
    and row offsets hold (3 values per piece, 1 per row + 1, int32 where they fit): writing the
    result's bytes once, the floor for that output (in a loop the allocator often hands back the
    same memory, so only the largest outputs pay fresh pages, as packsim's own result does).
    """
    if form == "cumsum":
        return lambda: np.cumsum(lengths)
    arrays = packsim.pack_arrays(lengths, capacity, strategy="wrapped")  # its size, not timed
    size = sum(a.nbytes for a in (arrays.index, arrays.start, arrays.length, arrays.row_offsets)) // 8
    return lambda: np.ones(size, dtype=np.int64)


def packer_call(name: str, lengths: np.ndarray, capacity: int, dataset, lists: bool = False):
    """A zero-argument callable running packer ``name`` once, and a function giving its stats.

    A packer in :data:`ARRAYS` runs ``pack_arrays`` (``lists=True``: ``pack``, the same packs as
    Python lists); the others run ``pack``.
    """
    if name in PACKSIM:
        strategy, overflow = PACKSIM[name]
        if name in ARRAYS and not lists:

            def run_arrays():
                return packsim.pack_arrays(lengths, capacity, strategy=strategy, overflow=overflow)

            return run_arrays, lambda arrays: packsim_stats(lengths, arrays.to_lists(), capacity)

        def run():
            return packsim.pack(lengths, capacity, strategy=strategy, overflow=overflow)

        return run, lambda packs: packsim_stats(lengths, packs, capacity)
    from trl import pack_dataset

    strategy, map_kwargs = TRL_PACKERS[name]

    def run_trl():
        return pack_dataset(dataset, capacity, strategy, map_kwargs=dict(map_kwargs))

    return run_trl, lambda out: trl_stats(out, capacity)


# ------------------------------------------------------------------------------ one configuration


def bench_config(lengths, capacity: int, packers: list[str], dataset, repeats: int, clock=time.perf_counter) -> dict:
    """Time every packer on the same lengths, ``repeats`` rounds in rotating order.

    Returns ``{packer: {"times": [...], "time_s": summary, **stats}}``; stats come from round 0
    and are computed outside the timed region. A packer in :data:`ARRAYS` also gets
    ``"lists": {"times", "time_s"}``, its ``pack`` result timed as one more call of each round,
    and ``"numpy": {ref: {"times", "time_s"}}``, the bare-numpy references of :func:`numpy_call`,
    each one more call of each round.
    """
    calls = {(p, False): packer_call(p, lengths, capacity, dataset) for p in packers}
    calls |= {(p, True): packer_call(p, lengths, capacity, dataset, lists=True) for p in packers if p in ARRAYS}
    calls |= {(p, ref): (numpy_call(ref, lengths, capacity), None)
              for p in packers if p in ARRAYS for ref in NUMPY_REFS}
    keys = list(calls)
    times: dict[tuple, list[float]] = {k: [] for k in keys}
    out: dict[str, dict] = {p: {} for p in packers}
    for r in range(repeats):
        for key in keys[r % len(keys):] + keys[: r % len(keys)]:
            run, stats = calls[key]
            t0 = clock()
            result = run()
            times[key].append(clock() - t0)
            if r == 0 and key[1] is False:
                out[key[0]].update(stats(result))
            del result
    for (p, form), ts in times.items():
        timing = {"times": ts, "time_s": bu.summarize(ts)}
        if form is True:
            out[p]["lists"] = timing
        elif form is False:
            out[p] = {**timing, **out[p]}
        else:
            out[p].setdefault("numpy", {})[form] = timing
    return out


def add_ratios(res: dict) -> None:
    """packsim/TRL time ratios (paired per round) for every packsim packer with a TRL counterpart."""
    for p in PACKSIM:
        if p not in res:
            continue
        for timed in (res[p], res[p].get("lists")):
            if timed is not None:
                timed["ratio_vs"] = {
                    t: bu.paired_ratio(timed["times"], res[t]["times"]) for t in COUNTERPART[p] if t in res
                }
                refs = res[p].get("numpy", {})  # times packsim takes over each bare-numpy reference
                if refs:
                    timed["ratio_vs_numpy"] = {f: bu.paired_ratio(timed["times"], refs[f]["times"]) for f in refs}


# ------------------------------------------------------------------------------ targets and tables


def check_targets(rows: list[dict], big_n: int) -> list[dict]:
    """The packing targets (issues 7 and 16), each with the measured value and whether it was met.

    - BFD fill >= 99% and within 0.5% of the lower bound (long-tailed, capacity >= 2048);
    - packsim BFD >= 2x faster than TRL's BFD at ``big_n`` (the target is at 1M), equal or better fill;
    - packsim wrapped at least as fast as TRL's wrapped as ``SFTTrainer`` calls it and at least
      5x faster than TRL's one-batch wrapped (issue 24) at every n and capacity, packsim BFD with
      overflow="split" faster than TRL's bfd_split wherever it runs, both with equal or better fill;
    - ``pack``'s lists for wrapped at least as fast as TRL's one-batch wrapped (issue 24).
    Each speed target is checked against TRL as ``SFTTrainer`` calls it and in one batch. For
    wrapped the time is ``pack_arrays`` (like TRL's columnar result); the measured text also
    gives the ratio of ``pack``'s lists and the times over the bare-numpy references.
    A target is met on the median of the paired per-round ratios.
    """
    checks = []
    for r in rows:
        if r["mix"] == "long_tailed" and r["packer"] == "bfd" and r["capacity"] >= 2048:
            ok = r["fill"] >= 0.99 and r["gap"] <= 0.005
            checks.append({
                "target": f"BFD fill >= 99% and gap <= 0.5% (long-tailed, n={r['n']:,}, cap {r['capacity']})",
                "measured": f"fill {r['fill']:.2%}, gap {r['gap']:.3%} ({r['packs']} packs, LB {r['lower_bound']})",
                "ok": ok,
            })
    by_key = {(r["mix"], r["n"], r["capacity"], r["packer"]): r for r in rows}
    goals = {"bfd": ("2x faster than", lambda ratio: ratio <= 0.5),  # packsim time / TRL time
             "wrapped": ("at least as fast as", lambda ratio: ratio <= 1.0),
             "wrapped_1batch": ("5x faster than", lambda ratio: ratio <= 0.2),
             "bfd_split": ("faster than", lambda ratio: ratio < 1.0)}
    for r in rows:
        if r["packer"] not in goals or (r["packer"] == "bfd" and not (r["mix"] == "long_tailed" and r["n"] == big_n)):
            continue
        for t, ratio in r.get("ratio_vs", {}).items():
            words, fast_enough = goals["wrapped_1batch" if t == "trl_wrapped_1batch" else r["packer"]]
            trl = by_key[(r["mix"], r["n"], r["capacity"], t)]
            where = f"{r['mix']}, n={r['n']:,}, cap {r['capacity']}"
            if r["packer"] == "bfd" and big_n < 1_000_000:
                where += "; the target is at 1M"
            lists = r.get("lists", {}).get("ratio_vs", {}).get(t)
            over_numpy = "; ".join(f"{bu.fmt_num(v['median'])}x {f}" for f, v in r.get("ratio_vs_numpy", {}).items())
            checks.append({
                "target": f"packsim {r['packer']} {words} {t}, equal or better fill ({where})",
                "measured": (
                    f"time ratio {bu.fmt_spread(ratio)} ({1 / ratio['median']:.2f}x); "
                    + (f"as lists (pack) {bu.fmt_spread(lists)}; " if lists else "")
                    + (f"over bare numpy {over_numpy}; " if over_numpy else "")
                    + f"packs {r['packs']} vs {trl['packs']}"
                ),
                "ok": fast_enough(ratio["median"]) and r["packs"] <= trl["packs"],
            })
            if lists and t == "trl_wrapped_1batch":
                checks.append({
                    "target": f"pack() lists (wrapped) at least as fast as {t} ({where})",
                    "measured": f"time ratio {bu.fmt_spread(lists)} ({1 / lists['median']:.2f}x)",
                    "ok": lists["median"] <= 1.0,
                })
    return checks


def results_table(rows: list[dict]) -> str:
    """One row per (mix, n, capacity, packer)."""
    headers = ["mix", "n", "cap", "load", "packer", "packs", "fill", "gap to LB", "time s (median [min-max])",
               "packsim/TRL time (SFT batching)", "packsim/TRL time (one batch)",
               "packsim/bare numpy time (cumsum; write)"]
    body = []
    for r in rows:
        names = COUNTERPART.get(r["packer"], ())
        forms = [(r["packer"], r)] + ([(f"{r['packer']} (lists)", r["lists"])] if "lists" in r else [])
        for name, timed in forms:
            ratios = timed.get("ratio_vs", {})
            over_numpy = timed.get("ratio_vs_numpy", {})
            body.append([
                r["mix"], f"{r['n']:,}", r["capacity"], bu.fmt_num(r.get("load_1min")), name, r["packs"],
                f"{r['fill']:.2%}", f"{r['gap']:.2%}", bu.fmt_spread(timed["time_s"]),
                *(bu.fmt_spread(ratios.get(t)) for t in (names or ("", ""))),
                "; ".join(bu.fmt_spread(over_numpy[f]) for f in NUMPY_REFS if f in over_numpy) or "-",
            ])
    return bu.markdown_table(headers, body)


def wrapped_table(rows: list[dict]) -> str:
    """The wrapped comparison of issue 24, one line per (mix, n, capacity): packsim ``pack_arrays``,
    TRL as ``SFTTrainer`` calls it, TRL in one batch and the bare-numpy references, in seconds
    (median), then each speed-up as median [min-max] of the per-round ratios (TRL time over
    packsim time: above 1, packsim faster) and packsim's time over each bare-numpy reference."""
    by_key = {(r["mix"], r["n"], r["capacity"], r["packer"]): r for r in rows}
    body = []
    for r in rows:
        if r["packer"] != "wrapped":
            continue
        key = (r["mix"], r["n"], r["capacity"])
        sft, one = by_key.get((*key, "trl_wrapped")), by_key.get((*key, "trl_wrapped_1batch"))
        refs = r.get("numpy", {})

        def faster(trl, timed):
            return bu.fmt_spread(bu.paired_ratio(trl["times"], timed["times"])) if trl else "-"

        body.append([
            r["mix"], f"{r['n']:,}", r["capacity"], bu.fmt_num(r.get("load_1min")),
            " / ".join(str(x["packs"]) if x else "-" for x in (r, sft, one)),
            *(bu.fmt_num(x["time_s"]["median"]) if x else "-" for x in (r, sft, one, refs.get("cumsum"), refs.get("write"))),
            faster(sft, r), faster(one, r),
            *(bu.fmt_spread(r.get("ratio_vs_numpy", {}).get(f)) for f in NUMPY_REFS),
            faster(one, r["lists"]) if "lists" in r else "-",
        ])
    headers = ["mix", "n", "cap", "load", "packs (packsim / TRL SFT / TRL 1 batch)", "pack_arrays s",
               "TRL SFT s", "TRL 1 batch s", "numpy cumsum s", "numpy write s", "x faster than TRL SFT",
               "x faster than TRL 1 batch", "x bare cumsum", "x bare write", "pack() lists: x faster than TRL 1 batch"]
    return bu.markdown_table(headers, body)


def targets_table(checks: list[dict]) -> str:
    return bu.markdown_table(
        ["target", "measured", "verdict"], [[c["target"], c["measured"], bu.verdict(c["ok"])] for c in checks]
    )


def merge_rows(previous: dict, rows: list[dict], packers: list[str]) -> tuple[list[dict], dict]:
    """``previous``'s rows of packers not in ``packers``, then ``rows``; and where they came from."""
    kept = [r for r in previous["rows"] if r["packer"] not in packers]
    source = {k: previous.get(k) for k in ("command", "machine", "load", "trl", "wall_s")}
    source["packers"] = list(dict.fromkeys(r["packer"] for r in kept))
    earlier = previous.get("merged_from")  # a merge of a merge: say where its kept rows came from
    if earlier and set(earlier["packers"]) & set(source["packers"]):
        source["merged_from"] = earlier
    order = {name: i for i, name in enumerate([*MIXES, *PACKSIM, *TRL_PACKERS])}
    merged = sorted(kept + rows, key=lambda r: (order[r["mix"]], r["n"], r["capacity"], order[r["packer"]]))
    return merged, source


# ------------------------------------------------------------------------------ main


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10k lengths only (< 1 minute)")
    ap.add_argument("--sizes", type=bu.int_list, help="long-tailed sizes (default 10k,100k,1M; quick 10k)")
    ap.add_argument("--uniform-sizes", type=bu.int_list,
                    help="uniform-mix sizes (default 10k,100k; quick 10k)")
    ap.add_argument("--bimodal-sizes", type=bu.int_list,
                    help="bimodal-mix sizes (default 100k,300k,1M; quick 10k)")
    ap.add_argument("--capacities", type=bu.int_list, default=[512, 2048, 8192])
    ap.add_argument("--repeats", type=int, default=3,
                    help="rounds per configuration (default 3; 2 x repeats + 1 up to 10k lengths)")
    ap.add_argument("--no-trl", action="store_true", help="skip TRL even if it is installed")
    ap.add_argument("--mixes", help=f"comma list from {','.join(MIXES)} (default: all)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall: time.perf_counter (default); cpu: time.process_time, this process's CPU "
                         "time, less moved by other jobs on a shared machine")
    ap.add_argument("--packers", help=f"comma list from {','.join([*PACKSIM, *TRL_PACKERS])} (default: all)")
    ap.add_argument("--out", help="results folder (default benchmarks/results, quick: runs/bench-quick)")
    ap.add_argument("--merge", action="store_true",
                    help="keep the rows of the packers not run here from the packing.json already in --out")
    args = ap.parse_args(argv)
    if args.sizes is None:
        args.sizes = [10_000] if args.quick else [10_000, 100_000, 1_000_000]
    if args.uniform_sizes is None:
        args.uniform_sizes = [10_000] if args.quick else [10_000, 100_000]
    if args.bimodal_sizes is None:
        args.bimodal_sizes = [10_000] if args.quick else [100_000, 300_000, 1_000_000]
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    args.packers = bu.parse_paths(ap, args.packers, [*PACKSIM, *TRL_PACKERS]) if args.packers else None
    args.mixes = bu.parse_paths(ap, args.mixes, list(MIXES)) if args.mixes else list(MIXES)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    before = bu.machine_info(threads=None)
    has_trl, trl_note = (False, "skipped (--no-trl)") if args.no_trl else trl_status()
    if not has_trl:
        print(f"TRL columns skipped: TRL is not importable here ({trl_note}). "
              "Install it with pip install -e '.[bench]' to compare.", flush=True)
    packers = [p for p in [*PACKSIM, *(TRL_PACKERS if has_trl else ())] if args.packers is None or p in args.packers]
    if has_trl:  # one-time costs (imports, first map) outside every timed configuration
        warm = make_lengths("long_tailed", 200)
        bench_config(warm, 512, packers, token_dataset(warm), 1)
    rows = []
    t_start = time.perf_counter()
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    mix_sizes = {"long_tailed": args.sizes, "uniform": args.uniform_sizes, "bimodal": args.bimodal_sizes}
    for mix, sizes in ((m, mix_sizes[m]) for m in args.mixes):
        for n in sizes:
            lengths = make_lengths(mix, n)
            t0 = time.perf_counter()
            dataset = token_dataset(lengths) if has_trl else None
            build_s = time.perf_counter() - t0
            for cap in args.capacities:
                overflows = int(lengths.max()) > cap  # else bfd_split is bfd: not run
                here = [p for p in packers if overflows or p not in SPLIT]
                rounds = args.repeats if n > SMALL_N else 2 * args.repeats + 1  # ms each: noise
                load = round(os.getloadavg()[0], 2)  # 1-min load average as this configuration starts
                res = bench_config(lengths, cap, here, dataset, rounds, clock)
                add_ratios(res)
                for p in here:
                    rows.append({"mix": mix, "n": n, "capacity": cap, "packer": p, "rounds": rounds, "load_1min": load,
                                 "dataset_build_s": build_s if p in TRL_PACKERS else None, **res[p]})
                print(f"{mix:11s} n={n:>9,} cap={cap:>5}: " + ", ".join(
                    f"{p} {res[p]['time_s']['median']:.3g} s" for p in here), flush=True)
            del dataset
    after = bu.machine_info(threads=None)
    out = bu.out_dir(args.out, args.quick)
    merged_from = None
    if args.merge and (Path(out) / "packing.json").exists():
        rows, merged_from = merge_rows(json.loads((Path(out) / "packing.json").read_text()), rows, packers)
    checks = check_targets(rows, max((r["n"] for r in rows if r["mix"] == "long_tailed"), default=0))
    payload = {
        "benchmark": "packing",
        "command": " ".join(["python benchmarks/packing.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine": after,
        "load": bu.load_note(before, after),
        "trl": trl_note if has_trl else f"not run: {trl_note}",
        "mixes": MIXES,
        "repeats": args.repeats,
        "clock": args.clock,
        "wall_s": time.perf_counter() - t_start,
        "rows": rows,
        "targets": checks,
    }
    if merged_from:
        payload["merged_from"] = merged_from
    path = bu.save_json(Path(out) / "packing.json", payload)
    kept = f"; kept the rows of {', '.join(merged_from['packers'])} from its previous run" if merged_from else ""
    print(f"\nwrote {path} ({payload['wall_s']:.0f} s; {payload['load']}{kept})\n")
    print(results_table(rows))
    print()
    print(wrapped_table(rows))
    print()
    if not has_trl:
        print("(TRL columns skipped: TRL not importable; the speed target needs it.)")
    print(targets_table(checks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
