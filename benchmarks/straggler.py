"""Benchmark: the straggler ratio of data-parallel ranks, packs dealt round-robin vs balanced by cost (lesson 10).

Every data-parallel step waits for its slowest rank, so a step takes ``max`` over ranks while the
useful work is the ``mean``: the straggler ratio ``max / mean`` (1.0: nobody waits) is the step's
slowdown from imbalance. On the long-tailed mix (``packsim.core.data.long_tailed_lengths``:
lognormal, median 90, sigma 0.9, clipped to [8, capacity]), ``--per-rank`` examples per rank per step,
rows of ``--capacity`` tokens (BFD), four ways to give ranks their work
(``packsim.scaling.step_plan.plan_step``):

- ``shard``: each rank packs its own contiguous 1/R of the step's examples (``packsim train``'s
  default, what a sharded sampler + per-rank packing collator does);
- ``round_robin``: the step is packed once and pack ``i`` goes to rank ``i % R``;
- ``tokens`` / ``attention``: the step is packed once and packs go, most expensive first, to the least
  loaded rank (``packsim.scaling.rank_balance.assign``), by tokens or by attention work (causal pairs, sum of L(L+1)/2).

Two measures of each rank's load:

1. model-free, every step, R = 2, 4, 8: tokens and attention work (causal score pairs, sum of L(L+1)/2);
2. measured, R = 2, a few steps: every pack's forward + backward on the tiny model
   (``build_model("tiny")``, ``correct`` setup, packsim's varlen attention), timed alone in this
   process (one thread, fastest of ``--repeats``); a rank's time is the sum of its packs' times,
   the compute it does before the all-reduce. The pack times are also correlated with each cost
   (and with the number of examples in the pack). ``--no-time`` skips it.

    python benchmarks/straggler.py            # 100 steps model-free, 4 timed steps
    python benchmarks/straggler.py --quick    # 10 steps, 1 timed step, small packs
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import benchutil as bu
import numpy as np

METHODS = ("shard", "round_robin", "tokens", "attention")
MIX = "long_tailed_lengths: lognormal, median 90, sigma 0.9, clipped to [8, capacity]"


def rank_packs(lengths: list[int], world_size: int, capacity: int, method: str) -> list[list[list[int]]]:
    """Each rank's packs, as segment lengths, for one step's example ``lengths`` (model-free)."""
    from packsim.core.packing import pack_pieces
    from packsim.scaling.rank_balance import assign

    def packs_of(ls):
        return [[p.stop - p.start for p in pk] for pk in pack_pieces(ls, capacity, "bfd")]

    if method == "shard":
        return [packs_of([lengths[i] for i in idx]) for idx in np.array_split(np.arange(len(lengths)), world_size)]
    packs = packs_of(lengths)
    return [[packs[i] for i in idx] for idx in assign(packs, world_size, "round_robin" if method == "round_robin"
                                                     else method)]


def model_free(steps: int, per_rank: int, capacity: int, worlds: list[int], seed: int) -> list[dict]:
    """Straggler ratios (mean and max over steps) by world size, method and cost."""
    from packsim.core.data import long_tailed_lengths
    from packsim.scaling.rank_balance import pack_costs, straggler_ratio

    rows = []
    for R in worlds:
        E = per_rank * R
        lengths = long_tailed_lengths(steps * E, max_len=capacity, seed=seed).tolist()
        ratios = {(m, c): [] for m in METHODS for c in ("tokens", "attention")}
        for s in range(steps):
            step = lengths[s * E : (s + 1) * E]
            for m in METHODS:
                costs = [pack_costs(p) for p in rank_packs(step, R, capacity, m)]
                for c in ("tokens", "attention"):
                    ratios[m, c].append(straggler_ratio([x[c].sum() for x in costs]))
        for (m, c), r in ratios.items():
            rows.append({"world_size": R, "method": m, "cost": c, "mean": statistics.fmean(r), "max": max(r),
                         "steps": steps})
    return rows


def measured(steps: int, per_rank: int, capacity: int, seed: int, threads: int, repeats: int = 2) -> dict:
    """Straggler ratio of measured compute, R = 2: every pack's forward + backward timed alone.

    A rank's time is the sum of its packs' times (each the fastest of ``repeats`` runs, so a busy
    machine inflates it less); the per-pack times are also correlated with each model-free cost.
    """
    import torch

    from packsim.core.data import examples_with_lengths, long_tailed_lengths
    from packsim.core.loss import token_losses
    from packsim.core.model import build_model, forward
    from packsim.experiment.training import TrainConfig, make_batches
    from packsim.scaling.rank_balance import assign, pack_costs, straggler_ratio
    from packsim.scaling.step_plan import plan_step, select_rows

    torch.set_num_threads(threads)
    R, E = 2, 2 * per_rank
    examples = examples_with_lengths(long_tailed_lengths((steps + 1) * E, max_len=capacity, seed=seed), seed=seed)
    model = build_model("tiny", seed=0).train()
    cfg = TrainConfig(examples_per_step=E, capacity=capacity)

    def seconds(batch) -> float:
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            token_losses(forward(model, batch), batch.labels).sum().backward()
            model.zero_grad(set_to_none=True)
            best = min(best, time.perf_counter() - t0)
        return best

    def rows_of(batch):  # (seconds, segment lengths) of each row timed alone
        out = []
        for i in range(batch.shape[0]):
            one = select_rows(batch, [i])
            out.append((seconds(one), one.row_lengths()[0]))
        return out

    seconds(make_batches(examples[:E], capacity, "correct", E)[0])  # warm-up (step 0 is never timed)
    packs, rows = [], []
    for s in range(1, steps + 1):
        step = examples[s * E : (s + 1) * E]
        timed = rows_of(make_batches(step, capacity, "correct", E)[0])  # the step packed once
        shard = [rows_of(b[0]) for b in plan_step(step, cfg, "correct", R, 1, "none")[0]]
        packs += timed + [p for rank in shard for p in rank]
        by_method = {"shard": [sum(t for t, _ in rank) for rank in shard]}
        for m in METHODS[1:]:
            ranks = assign([ls for _, ls in timed], R, m)
            by_method[m] = [sum(timed[i][0] for i in idx) for idx in ranks]
        for m, secs in by_method.items():
            rows.append({"step": s, "method": m, "rank_s": secs, "ratio": straggler_ratio(secs)})
    t = np.array([x for x, _ in packs])
    costs = pack_costs([ls for _, ls in packs])
    features = {"tokens": costs["tokens"], "attention": costs["attention"],
                "examples": np.array([len(ls) for _, ls in packs])}
    corr = {k: float(np.corrcoef(v, t)[0, 1]) for k, v in features.items()}
    return {"steps": rows, "packs_timed": len(packs), "correlation_with_pack_time": corr,
            "summary": {m: {"ratio": bu.summarize([r["ratio"] for r in rows if r["method"] == m]),
                            "step_s": bu.summarize([max(r["rank_s"]) for r in rows if r["method"] == m])}
                        for m in METHODS}}


def table(rows: list[dict], timed: dict | None) -> str:
    header = ["ranks", "cost", *METHODS]
    body = []
    for R in sorted({r["world_size"] for r in rows}):
        for c in ("tokens", "attention"):
            cells = {r["method"]: r for r in rows if r["world_size"] == R and r["cost"] == c}
            body.append([R, c, *(f"{cells[m]['mean']:.3f} (max {cells[m]['max']:.2f})" for m in METHODS)])
    if timed:
        body.append([2, "measured s", *(bu.fmt_spread(timed[m]["ratio"]) for m in METHODS)])
    return bu.markdown_table(header, body)


def parse_args(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="few steps, small packs (smoke run)")
    ap.add_argument("--steps", type=int, help="model-free steps (default 100; quick 10)")
    ap.add_argument("--timed-steps", type=int, help="measured steps (default 4; quick 1)")
    ap.add_argument("--per-rank", type=int, default=64, help="examples per rank per step (default 64)")
    ap.add_argument("--capacity", type=int, help="tokens per pack (default 2048; quick 1024)")
    ap.add_argument("--worlds", type=bu.int_list, default=[2, 4, 8], help="world sizes (default 2,4,8)")
    ap.add_argument("--no-time", action="store_true", help="model-free only")
    ap.add_argument("--repeats", type=int, default=2, help="timings per pack, fastest kept (default 2)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads for the timed part (default 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="output folder (default benchmarks/results; quick: runs/bench-quick)")
    args = ap.parse_args(argv)
    args.steps = args.steps or (10 if args.quick else 100)
    args.timed_steps = 0 if args.no_time else (args.timed_steps or (1 if args.quick else 4))
    args.capacity = args.capacity or (1024 if args.quick else 2048)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    before = bu.machine_info(threads=args.threads)
    t0 = time.perf_counter()
    rows = model_free(args.steps, args.per_rank, args.capacity, args.worlds, args.seed)
    timed = measured(args.timed_steps, args.per_rank, args.capacity, args.seed, args.threads, args.repeats) \
        if args.timed_steps else None
    after = bu.machine_info(threads=args.threads)
    payload = {
        "benchmark": "straggler",
        "command": " ".join(["python benchmarks/straggler.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine": after,
        "load": bu.load_note(before, after),
        "mix": MIX,
        "config": {k: getattr(args, k) for k in ("steps", "timed_steps", "per_rank", "capacity", "worlds",
                                                 "seed", "threads", "repeats")},
        "wall_s": time.perf_counter() - t0,
        "model_free": rows,
        "measured": timed,
    }
    path = bu.save_json(bu.out_dir(args.out, args.quick) / "straggler.json", payload)
    print(f"\nwrote {path} ({payload['wall_s']:.0f} s; {payload['load']})")
    print("straggler ratio = slowest rank / mean rank per step: mean over steps (max); measured: median "
          "[min-max] of forward+backward seconds\n")
    if timed:
        corr = ", ".join(f"{k} {v:.2f}" for k, v in timed["correlation_with_pack_time"].items())
        print(f"measured: {timed['packs_timed']} packs timed alone; correlation of pack time with {corr}\n")
    print(table(rows, timed["summary"] if timed else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
