"""Benchmark: ``PackedBatch.from_examples`` at 100k examples, built from arrays vs the loop it replaced.

Issue 24: the builder now lays the pieces out from ``pack_arrays`` with whole-array gathers
(``packsim/core/batch_layout.py``); before, it looped over ``pack_pieces``' Python pieces, a few
small tensors per piece. This script times both on the same examples, side by side in rotating
order (``loop`` is a copy of that builder, kept here for the before/after), checks they give the
same tensors, and prints one Markdown table::

    python benchmarks/from_examples.py                  # 100k examples, bfd and wrapped, capacity 1024
    python benchmarks/from_examples.py --n 20000 --repeats 1

Examples: ``packsim.make_examples(n, seed=0)`` (the course's tasks, 8-40 tokens each).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import benchutil as bu
import torch

from packsim.core.batch import PackedBatch, _positions, _validate
from packsim.core.data import make_examples
from packsim.core.loss import Role, make_labels
from packsim.core.packing import pack_pieces
from packsim.core.segments import Segment, cu_seqlens_from_lengths
from packsim.core.setups import get_setup


def loop_from_examples(examples, capacity: int, setup: str, strategy: str) -> dict:
    """``from_examples`` before issue 24 (packed setups): one Python loop over the pieces."""
    setup = get_setup(setup)
    parts = _validate(examples, capacity, None)
    rows = pack_pieces([len(t) for t, _ in parts], capacity, strategy=strategy, overflow="error")
    B, T = len(rows), capacity
    ids = torch.zeros((B, T), dtype=torch.long)
    seq = torch.full((B, T), -1, dtype=torch.long)
    roles = torch.full((B, T), int(Role.PAD), dtype=torch.uint8)
    reset_pos = torch.zeros((B, T), dtype=torch.long)
    segments = []
    for r, row in enumerate(rows):
        t = 0
        for p in row:
            tokens, n_prompt = parts[p.index]
            n = p.stop - p.start
            ids[r, t : t + n] = torch.tensor(tokens[p.start : p.stop])
            seq[r, t : t + n] = p.index
            reset_pos[r, t : t + n] = torch.arange(n)  # 0.. in every piece (issue 30)
            got = [Role.PROMPT if j < n_prompt else Role.EOS if j == len(tokens) - 1 else Role.RESPONSE
                   for j in range(p.start, p.stop)]
            got[0] = Role.FIRST if t == 0 else Role.BOUNDARY
            roles[r, t : t + n] = torch.tensor(got, dtype=torch.uint8)
            segments.append(Segment(r, t, t + n, p.index))
            t += n
        reset_pos[r, t:] = torch.arange(T - t)
    cu = cu_seqlens_from_lengths(torch.tensor([s.stop - s.start for s in segments]))
    return {"input_ids": ids, "labels": make_labels(ids, roles, setup.loss), "roles": roles,
            "position_ids": _positions(reset_pos, setup), "cu_seqlens": cu, "segments": segments}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="examples (default 100k)")
    ap.add_argument("--capacity", type=int, default=1024)
    ap.add_argument("--strategies", default="bfd,wrapped")
    ap.add_argument("--repeats", type=int, default=3, help="rounds (default 3)")
    ap.add_argument("--out", help="results folder (default benchmarks/results)")
    args = ap.parse_args(argv)
    before = bu.machine_info(threads=torch.get_num_threads())
    examples = make_examples(args.n, seed=0)
    n_tokens = sum(len(e.tokens) for e in examples)
    for warm in (PackedBatch.from_examples, loop_from_examples):  # one-time costs (torch's first ops)
        warm(examples[:50], args.capacity, "correct", strategy="bfd")
    rows = []
    for strategy in args.strategies.split(","):
        calls = {
            "arrays": lambda s=strategy: PackedBatch.from_examples(examples, args.capacity, "correct", strategy=s),
            "loop": lambda s=strategy: loop_from_examples(examples, args.capacity, "correct", s),
        }
        times = {k: [] for k in calls}
        out = {}
        for r in range(args.repeats):
            for k in list(calls)[r % 2:] + list(calls)[: r % 2]:
                t0 = time.perf_counter()
                out[k] = calls[k]()
                times[k].append(time.perf_counter() - t0)
        new, old = out["arrays"], out["loop"]
        same = all(torch.equal(getattr(new, k), old[k]) for k in ("input_ids", "labels", "roles", "position_ids",
                                                                   "cu_seqlens")) and new.segments == old["segments"]
        if not same:
            raise SystemExit(f"{strategy}: the two builders disagree")
        rows.append({"strategy": strategy, "rows": new.shape[0], "pieces": len(new.segments),
                     **{k: {"times": v, "time_s": bu.summarize(v)} for k, v in times.items()},
                     "loop_over_arrays": bu.paired_ratio(times["loop"], times["arrays"])})
        print(f"{strategy}: arrays {rows[-1]['arrays']['time_s']['median']:.2f} s, "
              f"loop {rows[-1]['loop']['time_s']['median']:.2f} s", flush=True)
    after = bu.machine_info(threads=torch.get_num_threads())
    payload = {"benchmark": "from_examples", "command": " ".join(["python benchmarks/from_examples.py",
                                                                  *(sys.argv[1:] if argv is None else argv)]),
               "machine": after, "load": bu.load_note(before, after), "n_examples": args.n,
               "n_tokens": n_tokens, "capacity": args.capacity, "rows": rows}
    path = bu.save_json(Path(bu.out_dir(args.out, False)) / "from_examples.json", payload)
    print(f"\nwrote {path} ({payload['load']}; {args.n:,} examples, {n_tokens:,} tokens, capacity {args.capacity})\n")
    print(bu.markdown_table(
        ["strategy", "rows", "pieces", "from arrays s (median [min-max])", "loop (before) s", "loop / arrays"],
        [[r["strategy"], r["rows"], r["pieces"], bu.fmt_spread(r["arrays"]["time_s"]),
          bu.fmt_spread(r["loop"]["time_s"]), bu.fmt_spread(r["loop_over_arrays"])] for r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
