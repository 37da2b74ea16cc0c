"""Benchmark: context parallelism over packed documents on torch's own CP, 2 and 4 gloo ranks vs one process (lesson 10).

Each configuration ``RxT`` is one launch of ``packsim.scaling.cp_compare`` through torchrun
(``R`` gloo processes, one thread each): the course's committed trained model on one packed row of
``T`` task tokens, each document padded to a multiple of 2R. Two layouts
(``packsim.scaling.cp_attention``): ``documents`` (torch's ``_PerDocumentHeadTailLoadBalancer``,
a flex document BlockMask sharded by ``_context_parallel_shard``, K/V all-gathered by torch's
``_ContextParallel`` flex hook) and ``ring_causal`` (torch's ring attention over the head-tail split
of the whole row, plain causal: axolotl#3608's trap). Per layout: the largest logit difference
against one process with the same mask and against every document alone (the leak), the largest
gradient difference (relative to the largest gradient entry), the step-0 response loss and its
ratio to the ``documents`` run, the audit's verdict (``audit_context_parallel`` on every rank), and
rank 0's seconds for the shard, the forward and the loss + backward. A second table, model-free,
gives each rank's causal attention work (the keys its queries need, ``offset + 1`` per token) under
torch's two balancers and packsim's ``zigzag_split``, as the slowest rank over the mean.

    python benchmarks/context_parallel.py                 # 2x256, 4x512, 4x2048
    python benchmarks/context_parallel.py --quick         # 2x256 only
"""

from __future__ import annotations

import argparse
import sys
import time

import benchutil as bu


def configs(text: str) -> list[tuple[int, int]]:
    """argparse type: ``"2x256,4x512"`` -> ``[(2, 256), (4, 512)]`` (ranks x row tokens)."""
    out = []
    for part in text.split(","):
        try:
            r, t = (int(x) for x in part.strip().lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r}: write ranks x tokens, e.g. 2x256,4x512") from None
        out.append((r, t))
    return out


def work_rows(R: int, T: int, seed: int) -> list[dict]:
    """Per-rank causal attention work of the row under each balancer (model-free, no process group)."""
    import torch

    from packsim.core.data import make_examples
    from packsim.scaling.context_parallel import causal_work, zigzag_split
    from packsim.scaling.cp_attention import document_row, rank_positions
    from packsim.scaling.rank_balance import straggler_ratio

    row = document_row(make_examples(T // 4 + 16, seed=seed), T, R)
    offsets = row.position_ids[0]  # (T,) each token's offset in its document
    rows = []
    for layout, name in (("documents", "torch _PerDocumentHeadTailLoadBalancer"),
                         ("ring_causal", "torch _HeadTailLoadBalancer (whole row)")):
        work = [int((offsets[torch.tensor(p)] + 1).sum()) for p in rank_positions(row.lengths, R, layout)]
        rows.append({"balancer": name, "work": work, "ratio": straggler_ratio(work)})
    zig = causal_work(zigzag_split(row.lengths, R)).tolist()
    rows.append({"balancer": "packsim zigzag_split (chunks i, 2R-1-i of every document)", "work": zig,
                 "ratio": straggler_ratio(zig)})
    return rows


def table(results: list[dict]) -> str:
    header = ["ranks", "T", "docs", "layout", "logits vs one process", "logits vs alone", "grad diff / max grad",
              "step-0 loss", "x documents", "audit", "shard s", "forward s", "loss+backward s", "wall s"]
    body = []
    for res in results:
        for name, r in res["layouts"].items():
            s = r["seconds"]
            body.append([res["world_size"], res["tokens"], len(res["real"]), name,
                         f"{r['max_logit_diff_one_process']:.1e}", f"{r['max_logit_diff_alone']:.3g}",
                         f"{r['max_grad_diff'] / r['max_grad']:.1e}", f"{r['loss']:.4f}", f"{r['loss_ratio']:.1f}",
                         r["audit"]["status"].upper(), f"{s['shard']:.2f}", f"{s['forward']:.3f}",
                         f"{s['loss_backward']:.3f}", f"{res['wall_s']:.0f}"])
    return bu.markdown_table(header, body)


def work_table(results: list[dict]) -> str:
    body = [[res["world_size"], res["tokens"], w["balancer"], " / ".join(map(str, w["work"])), f"{w['ratio']:.3f}"]
            for res in results for w in res["work"]]
    return bu.markdown_table(["ranks", "T", "balancer", "causal work per rank", "slowest / mean"], body)


def parse_args(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2x256 only (smoke run)")
    ap.add_argument("--configs", type=configs, help="ranks x row tokens (default 2x256,4x512,4x2048)")
    ap.add_argument("--seed", type=int, default=7, help="which task examples fill the row")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per launch")
    ap.add_argument("--out", help="output folder (default benchmarks/results; quick: runs/bench-quick)")
    args = ap.parse_args(argv)
    args.configs = args.configs or ([(2, 256)] if args.quick else [(2, 256), (4, 512), (4, 2048)])
    return args


def main(argv=None) -> int:
    from packsim.scaling.cp_compare import launch

    args = parse_args(argv)
    before = bu.machine_info(threads=1)
    t0 = time.perf_counter()
    results = []
    for R, T in args.configs:
        res = launch(nproc=R, tokens=T, seed=args.seed, timeout=args.timeout)
        res["work"] = work_rows(R, T, args.seed)
        results.append(res)
    after = bu.machine_info(threads=1)
    payload = {
        "benchmark": "context_parallel",
        "command": " ".join(["python benchmarks/context_parallel.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine": after,
        "load": bu.load_note(before, after),
        "wall_s": time.perf_counter() - t0,
        "results": results,
    }
    path = bu.save_json(bu.out_dir(args.out, args.quick) / "context_parallel.json", payload)
    print(f"\nwrote {path} ({payload['wall_s']:.0f} s; {payload['load']})")
    print("torch here: " + "; ".join(f"{k}: {v}" for k, v in results[0]["probe"].items()) + "\n")
    print(table(results))
    print()
    print(work_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
