"""Benchmark: packing from each input kind (issue 33), packsim vs TRL in one batch vs a bare cumsum.

Users hand ``packsim.pack_arrays`` / ``pack`` their lengths as a Python list, a numpy array, a
tensor or an Arrow / ``datasets`` column. Before issue 33 a list was checked one element at a
time in Python (178 ms for 300k lengths where the int64 array took 2.5 ms); now every kind is
read at array speed (``packsim/core/pack_lengths.py``). For each mix and capacity this times,
side by side in rotating order, ``--repeats`` rounds::

    python benchmarks/pack_inputs.py           # bimodal and long-tailed mixes, 300k lengths, caps 512/2048/8192
    python benchmarks/pack_inputs.py --quick   # 10k lengths, a few seconds

- ``pack_arrays(lengths, capacity, "wrapped")`` from each input kind (:data:`KINDS`, each built
  beforehand by :func:`make_inputs`, not timed), and ``read``: ``check_lengths`` alone, timed as its own call
  (so on a noisy machine it can exceed the row's whole time), what reading that kind costs;
- ``list (before)``: the per-element check of the list that ``pack_arrays`` ran before issue 33
  (:func:`before_read`, a verbatim copy), then ``pack_arrays`` on its int64 array;
- ``pack() lists``: ``pack(list, capacity, "wrapped")``, the same packs as Python lists;
- TRL's ``pack_dataset(dataset, capacity, "wrapped", map_kwargs={"batch_size": None})`` (one
  global batch) on an int8 token column (``benchmarks/packing.py``'s ``token_dataset``);
- ``np.cumsum`` of the int64 lengths into a buffer made beforehand: the one pass wrapped packing
  cannot do without (a fresh 2.4 MB output each call would time the page faults of the first
  calls, 0.6-2.5 ms at 300k on this machine where the pass takes about 0.3 ms).

Every kind's packs are checked equal to the int64 array's before timing. Ratios are per round
(same round, same lengths): ``x faster than TRL`` is TRL's time over this row's, ``x cumsum`` this
row's time over the cumsum's. Mixes: ``bimodal`` (issue 24's: 75% lognormal(4.4, 0.7), 25%
lognormal(6.5, 0.6), clipped to 2..4096) and ``long_tailed``, the project's own
(``packsim.core.data.long_tailed_lengths``: median 90, sigma 1.0, clipped to 1..2048).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import benchutil as bu
import numpy as np
from packing import make_lengths, token_dataset, trl_status

import packsim
from packsim.core.errors import PacksimError
from packsim.core.pack_lengths import check_lengths, is_int

MIXES = ("bimodal", "long_tailed")
KINDS = ("list", "int64 array", "int32 array", "torch tensor", "pyarrow array", "datasets column")


def make_inputs(lengths: np.ndarray) -> dict:
    """The int64 lengths as each input kind in :data:`KINDS` (pyarrow and ``datasets`` come with
    TRL, ``pip install -e '.[bench]'``: a kind whose package is missing is left out)."""
    import torch

    inputs = {"list": lengths.tolist(), "int64 array": lengths.copy(), "int32 array": lengths.astype(np.int32),
              "torch tensor": torch.from_numpy(lengths.copy())}
    try:
        import datasets
        import pyarrow as pa
    except ImportError:
        return inputs
    datasets.disable_progress_bars()
    inputs["pyarrow array"] = pa.array(lengths)
    inputs["datasets column"] = datasets.Dataset.from_dict({"n": lengths})["n"]
    return inputs


def before_read(lengths: list) -> np.ndarray:
    """How ``pack_arrays`` read a list before issue 33 (``packsim/core/packing.py:_as_int_array``,
    verbatim in substance): one Python check per element, then ``np.asarray``."""
    for i, n in enumerate(lengths):
        if not is_int(n):
            raise PacksimError(f"example {i} has length {n!r}, not an integer")
    sizes = np.asarray(lengths, dtype=np.int64)
    if sizes.size and sizes.min() <= 0:
        raise PacksimError("every example needs at least 1 token")
    return sizes


def calls_for(lengths: np.ndarray, capacity: int, inputs: dict, dataset) -> dict:
    """name -> zero-argument callable timed once per round."""
    calls = {}
    for kind, value in inputs.items():
        calls[(kind, "pack_arrays")] = lambda v=value: packsim.pack_arrays(v, capacity, "wrapped")
        calls[(kind, "read")] = lambda v=value: check_lengths(v)
    calls[("list (before)", "pack_arrays")] = lambda: packsim.pack_arrays(before_read(inputs["list"]), capacity,
                                                                          "wrapped")
    calls[("list (before)", "read")] = lambda: before_read(inputs["list"])
    calls[("list", "pack() lists")] = lambda: packsim.pack(inputs["list"], capacity, "wrapped")
    into = np.empty_like(lengths)  # written in place: the pass itself, not the allocator's fresh pages
    calls[("numpy", "cumsum")] = lambda: np.cumsum(lengths, out=into)
    if dataset is not None:
        from trl import pack_dataset

        calls[("trl", "1 batch")] = lambda: pack_dataset(dataset, capacity, "wrapped",
                                                          map_kwargs={"batch_size": None})
    return calls


def check_same_packs(inputs: dict, capacity: int) -> None:
    want = packsim.pack_arrays(inputs["int64 array"], capacity, "wrapped")
    fields = ("index", "start", "length", "row_offsets", "example_lengths")
    for kind, value in inputs.items():
        got = packsim.pack_arrays(value, capacity, "wrapped")
        if not all(np.array_equal(getattr(got, f), getattr(want, f)) for f in fields):
            raise SystemExit(f"{kind}: packs differ from the int64 array's")


def bench_config(lengths: np.ndarray, capacity: int, inputs: dict, dataset, rounds: int) -> dict:
    """Times of every call, ``rounds`` rounds in an order rotating by one each round."""
    calls = calls_for(lengths, capacity, inputs, dataset)
    names = list(calls)
    times = {k: [] for k in names}
    for r in range(rounds):
        for k in names[r % len(names):] + names[: r % len(names)]:
            t0 = time.perf_counter()
            result = calls[k]()
            times[k].append(time.perf_counter() - t0)
            del result
    return times


def rows_of(mix: str, n: int, capacity: int, load: float, times: dict) -> list[dict]:
    trl, cumsum = times.get(("trl", "1 batch")), times[("numpy", "cumsum")]
    rows = []
    for (kind, what), ts in times.items():
        if kind in ("trl", "numpy") or what == "read":
            continue
        read = times.get((kind, "read"))
        rows.append({
            "mix": mix, "n": n, "capacity": capacity, "load_1min": load, "input": kind, "call": what,
            "times": ts, "time_s": bu.summarize(ts),
            "read": {"times": read, "time_s": bu.summarize(read)} if read else None,
            "x_faster_than_trl_1batch": bu.paired_ratio(trl, ts) if trl else None,
            "x_cumsum": bu.paired_ratio(ts, cumsum),
        })
    for (kind, what) in (("trl", "1 batch"), ("numpy", "cumsum")):
        if (kind, what) in times:
            ts = times[(kind, what)]
            rows.append({"mix": mix, "n": n, "capacity": capacity, "load_1min": load, "input": kind, "call": what,
                         "times": ts, "time_s": bu.summarize(ts), "read": None,
                         "x_faster_than_trl_1batch": None, "x_cumsum": bu.paired_ratio(ts, cumsum)})
    return rows


def table(rows: list[dict]) -> str:
    headers = ["mix", "n", "cap", "load", "input", "call", "time ms (median [min-max])", "reading alone ms (check_lengths)",
               "x faster than TRL 1 batch", "x bare cumsum"]
    body = [[r["mix"], f"{r['n']:,}", r["capacity"], bu.fmt_num(r["load_1min"]), r["input"], r["call"],
             bu.fmt_spread(r["time_s"], 1e3), bu.fmt_spread(r["read"]["time_s"], 1e3) if r["read"] else "-",
             bu.fmt_spread(r["x_faster_than_trl_1batch"]), bu.fmt_spread(r["x_cumsum"])] for r in rows]
    return bu.markdown_table(headers, body)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10k lengths, 3 rounds")
    ap.add_argument("--n", type=int, help="lengths per mix (default 300k; quick 10k)")
    ap.add_argument("--capacities", type=bu.int_list, default=[512, 2048, 8192])
    ap.add_argument("--mixes", help=f"comma list from {','.join(MIXES)} (default: both)")
    ap.add_argument("--repeats", type=int, help="rounds per configuration (default 5; quick 3)")
    ap.add_argument("--no-trl", action="store_true", help="skip TRL even if it is installed")
    ap.add_argument("--out", help="results folder (default benchmarks/results, quick: runs/bench-quick)")
    args = ap.parse_args(argv)
    n = args.n or (10_000 if args.quick else 300_000)
    rounds = args.repeats or (3 if args.quick else 5)
    mixes = bu.parse_paths(ap, args.mixes, list(MIXES)) if args.mixes else list(MIXES)
    before = bu.machine_info(threads=None)
    has_trl, trl_note = (False, "skipped (--no-trl)") if args.no_trl else trl_status()
    if not has_trl:
        print(f"TRL column skipped: {trl_note}", flush=True)
    warm = make_lengths("bimodal", 200)  # one-time costs (numba load, imports, TRL's first map)
    warm_inputs = make_inputs(warm)
    bench_config(warm, 512, warm_inputs, token_dataset(warm) if has_trl else None, 1)
    rows, t_start = [], time.perf_counter()
    for mix in mixes:
        lengths = make_lengths(mix, n)
        inputs = make_inputs(lengths)
        dataset = token_dataset(lengths) if has_trl else None
        for cap in args.capacities:
            check_same_packs(inputs, cap)
            load = round(os.getloadavg()[0], 2)
            times = bench_config(lengths, cap, inputs, dataset, rounds)
            rows += rows_of(mix, n, cap, load, times)
            print(f"{mix} n={n:,} cap={cap}: " + ", ".join(
                f"{k[0]} {bu.fmt_num(bu.summarize(v)['median'])} s" for k, v in times.items() if k[1] != "read"),
                flush=True)
    after = bu.machine_info(threads=None)
    payload = {"benchmark": "pack_inputs",
               "command": " ".join(["python benchmarks/pack_inputs.py", *(sys.argv[1:] if argv is None else argv)]),
               "machine": after, "load": bu.load_note(before, after), "trl": trl_note, "n": n, "rounds": rounds,
               "wall_s": time.perf_counter() - t_start, "rows": rows}
    path = bu.save_json(Path(bu.out_dir(args.out, args.quick)) / "pack_inputs.json", payload)
    print(f"\nwrote {path} ({payload['wall_s']:.0f} s; {payload['load']})\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
