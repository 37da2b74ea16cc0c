"""Benchmark 2: attention cost vs pack length, on CPU (notebook 08, varlen internals).

Packs of N = 1k ... 16k tokens made of realistic example lengths (the course's long-tailed mix:
lognormal, median 90, sigma 0.9, clipped to [8, 2048]; about 64 examples at 8k), with the
attention shape of the ``small`` model (8 heads x 32 dims), fp32. Paths:

- ``dense``: SDPA with the dense (N, N) block-diagonal mask (packsim backend ``dense``);
- ``blocked``: packsim's per-example path (backend ``blocked``, the CPU default): SDPA per
  length bucket, no N x N mask;
- ``flex``: ``torch.compile(flex_attention)`` with a document BlockMask, forward only (FlexAttention
  has no CPU backward in torch 2.13); compile and BlockMask build times are reported apart;
- ``causal``: SDPA ``is_causal=True`` over the whole pack: the buggy mask (examples see each
  other), kept as the speed reference.

Each (path, N) runs in its own fresh process: after a tiny warm-up pack (library start-up), one
untimed forward + backward call gives the peak memory (peak RSS above the RSS just before the
call), then timed forward + backward calls and timed forward-only calls (median [min-max]).
Flex's memory is not reported: it runs after compiling, and reuses the heap the compiler freed.

    python benchmarks/attention.py            # N = 1k, 2k, 4k, 8k, 16k
    python benchmarks/attention.py --quick    # N = 4k only
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import benchutil as bu
import numpy as np

PATHS = ("dense", "blocked", "flex", "causal")
TRAINS = {"dense": True, "blocked": True, "flex": False, "causal": True}
MIX = "long-tailed: lognormal, median 90, sigma 0.9, clipped to [8, 2048] (packsim.core.data.long_tailed_lengths)"


# ------------------------------------------------------------------------------ one measurement


def _steps(path: str, q, k, v, cu, max_len: int, grad):
    """(forward+backward step or None, forward-only step, setup info) for one path.

    q, k, v, grad: (N, H, D) fp32 leaves; cu: (S+1,) int32.
    """
    import torch
    import torch.nn.functional as F

    from packsim.core.attention import varlen_attention

    info: dict = {}
    if path in ("dense", "blocked"):
        def fwd():
            return varlen_attention(q, k, v, cu, cu, max_len, max_len, causal=True, backend=path)
    elif path == "causal":
        def fwd():
            qh, kh, vh = (t.transpose(0, 1)[None] for t in (q, k, v))  # (1, H, N, D)
            return F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)[0].transpose(0, 1)
    elif path == "flex":
        from torch.nn.attention.flex_attention import flex_attention

        from packsim.core.masks import flex_block_mask
        from packsim.core.segments import seq_ids_from_cu_seqlens

        t0 = time.perf_counter()
        block_mask = flex_block_mask(seq_ids_from_cu_seqlens(cu))
        info["block_mask_s"] = time.perf_counter() - t0
        compiled = torch.compile(flex_attention, dynamic=False)
        qd, kd, vd = (t.detach().transpose(0, 1)[None] for t in (q, k, v))  # (1, H, N, D)

        def fwd():
            return compiled(qd, kd, vd, block_mask=block_mask)[0].transpose(0, 1)

        with torch.no_grad():
            t0 = time.perf_counter()
            fwd()
            info["compile_s"] = time.perf_counter() - t0  # first call: compile + run
    else:
        raise ValueError(f"unknown path {path!r}; use one of {PATHS}")

    def fwd_bwd():
        for t in (q, k, v):
            t.grad = None
        fwd().backward(grad)

    def fwd_only():
        with torch.no_grad():
            fwd()

    return (fwd_bwd if TRAINS[path] else None), fwd_only, info


def measure(spec: dict) -> dict:
    """One (path, N): peak memory of one call, then timed fwd+bwd and forward-only calls."""
    import torch

    torch.set_num_threads(int(spec["threads"]))
    torch.manual_seed(int(spec.get("seed", 0)))
    N, H, D = int(spec["n"]), int(spec["heads"]), int(spec["head_dim"])
    lengths = bu.pack_lengths(N, int(spec.get("seed", 0)))
    cu = bu.cu_from_lengths(lengths)
    if TRAINS[spec["path"]]:  # initialise the libraries on a tiny pack, so the peak below is N's own
        tiny = [torch.randn(64, H, D, requires_grad=True) for _ in range(3)]
        warm, _, _ = _steps(spec["path"], *tiny, bu.cu_from_lengths([40, 24]), 40, torch.randn(64, H, D))
        warm()
    q, k, v = (torch.randn(N, H, D, requires_grad=True) for _ in range(3))  # (N, H, D)
    grad = torch.randn(N, H, D)
    fwd_bwd, fwd_only, info = _steps(spec["path"], q, k, v, cu, max(lengths), grad)
    first = fwd_bwd or fwd_only
    rss0 = bu.current_rss_mb()
    reset_ok = bu.reset_peak_rss()
    t0 = time.perf_counter()
    first()
    first_s = time.perf_counter() - t0
    peak = bu.peak_rss_mb()
    iters, max_s = int(spec["iters"]), float(spec["max_s"])
    out = {
        "path": spec["path"], "n": N, "examples": len(lengths), "max_len": max(lengths),
        "rss_before_mb": rss0,
        "peak_mb": (peak - rss0) if (reset_ok and fwd_bwd and peak is not None and rss0 is not None)
        else None,  # flex: measured after compiling, whose freed heap the call reuses: not meaningful
        "peak_measured_on": "fwd+bwd" if fwd_bwd else "not measured (after compile)",
        "first_call_s": first_s,
        "fwd_bwd_times": bu.time_calls(fwd_bwd, iters, warmup=0, max_s=max_s) if fwd_bwd else [],
        "fwd_times": bu.time_calls(fwd_only, iters, warmup=0 if fwd_bwd is None else 1, max_s=max_s),
        **info,
    }
    return out


# ------------------------------------------------------------------------------ the run


def theory(n: int) -> dict:
    """Score pairs each path computes for the pack of ``n`` tokens (packsim.core.tiles.attention_work)."""
    from packsim.core.tiles import attention_work

    w = attention_work(bu.cu_from_lengths(bu.pack_lengths(n)), causal=True, tile=128)
    return {"dense_pairs": w.dense_pairs, "causal_pairs": w.pack_pairs, "varlen_pairs": w.varlen_pairs,
            "tiles_computed": w.tiles_computed, "tiles_total": w.tiles_total}


PAIRS_KEY = {"dense": "dense_pairs", "causal": "causal_pairs", "blocked": "varlen_pairs", "flex": "varlen_pairs"}


def run_all(args) -> list[dict]:
    """Every (path, N), ``args.rounds`` rounds, paths in rotating order; one row per (path, N)."""
    script = Path(__file__).resolve()
    raw: dict[tuple[str, int], list[dict]] = {}
    for r in range(args.rounds):
        for n in args.sizes:
            paths = args.paths[r % len(args.paths):] + args.paths[: r % len(args.paths)]
            for path in paths:
                spec = {"path": path, "n": n, "heads": args.heads, "head_dim": args.head_dim,
                        "threads": args.threads, "iters": args.iters, "max_s": args.max_s, "seed": 0}
                res = measure(spec) if args.in_process else bu.run_worker(script, spec, args.timeout)
                raw.setdefault((path, n), []).append(res)
                msg = res.get("error") or (
                    f"fwd+bwd {bu.fmt_spread(bu.summarize(res['fwd_bwd_times']))} s, "
                    f"fwd {bu.fmt_spread(bu.summarize(res['fwd_times']))} s, peak {bu.fmt_num(res['peak_mb'])} MiB"
                )
                print(f"round {r} N={n:>6} {path:8s} {msg}", flush=True)
    rows = []
    for n in args.sizes:
        th = theory(n)
        for path in args.paths:
            runs = [x for x in raw[(path, n)] if "error" not in x]
            row = {"path": path, "n": n, "pairs": th[PAIRS_KEY[path]], "theory": th,
                   "errors": [x["error"] for x in raw[(path, n)] if "error" in x]}
            if runs:
                peaks = [x["peak_mb"] for x in runs if x["peak_mb"] is not None]
                row.update({
                    "examples": runs[0]["examples"], "max_len": runs[0]["max_len"],
                    "fwd_bwd_times": [t for x in runs for t in x["fwd_bwd_times"]],
                    "fwd_times": [t for x in runs for t in x["fwd_times"]],
                    "peak_mb": bu.summarize(peaks), "peak_measured_on": runs[0]["peak_measured_on"],
                    **{k: runs[0][k] for k in ("compile_s", "block_mask_s") if k in runs[0]},
                })
                row["fwd_bwd_s"] = bu.summarize(row["fwd_bwd_times"])
                row["fwd_s"] = bu.summarize(row["fwd_times"])
            rows.append(row)
    add_ratios(rows)
    return rows


def add_ratios(rows: list[dict]) -> None:
    """Each path's time over blocked's at the same N (fwd+bwd and forward-only)."""
    ref = {r["n"]: r for r in rows if r["path"] == "blocked" and "fwd_s" in r}
    for r in rows:
        b = ref.get(r["n"])
        if b is None or "fwd_s" not in r:
            continue
        if r.get("fwd_bwd_times") and b.get("fwd_bwd_times"):
            r["fwd_bwd_vs_blocked"] = bu.paired_ratio(r["fwd_bwd_times"], b["fwd_bwd_times"])
        r["fwd_vs_blocked"] = bu.paired_ratio(r["fwd_times"], b["fwd_times"])


def memory_exponent(rows: list[dict], path: str, min_n: int = 2048) -> float | None:
    """Slope of log(peak memory) vs log(N) over N >= min_n: ~1 linear, ~2 quadratic."""
    pts = [(r["n"], r["peak_mb"]["median"]) for r in rows
           if r["path"] == path and r["n"] >= min_n and r.get("peak_mb", {}).get("n")]
    pts = [(n, m) for n, m in pts if m and m > 0]
    if len(pts) < 2:
        return None
    x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
    return float(np.polyfit(x, y, 1)[0])


def check_targets(rows: list[dict]) -> list[dict]:
    checks = []
    slope = memory_exponent(rows, "blocked")
    if slope is not None:
        dense = memory_exponent(rows, "dense")
        checks.append({
            "target": "varlen (blocked) peak memory grows linearly in N (log-log slope <= 1.25, N >= 2k)",
            "measured": f"slope {slope:.2f} (dense: {bu.fmt_num(dense)})",
            "ok": slope <= 1.25,
        })
    by = {(r["path"], r["n"]): r for r in rows}
    for n in sorted({r["n"] for r in rows}):
        if n != 8192 and not (n == max(r["n"] for r in rows) and 8192 not in {r["n"] for r in rows}):
            continue
        d = by.get(("dense", n), {})
        if "fwd_bwd_vs_blocked" in d:
            ratio = d["fwd_bwd_vs_blocked"]
            note = "" if n == 8192 else "; the target is at 8k"
            checks.append({
                "target": f"blocked >= 5x faster than dense-mask SDPA, fwd+bwd, N={n:,} ({d['examples']} examples{note})",
                "measured": f"dense/blocked time {bu.fmt_spread(ratio)}",
                "ok": ratio["median"] >= 5,
            })
    return checks


def results_table(rows: list[dict]) -> str:
    headers = ["N", "examples", "path", "fwd+bwd s", "fwd s", "peak MiB", "fwd+bwd / blocked",
               "fwd / blocked", "score pairs", "note"]
    body = []
    for r in rows:
        note = "; ".join(r.get("errors", []))[:60]
        if "compile_s" in r:
            note = f"fwd only; compile {r['compile_s']:.1f} s, BlockMask {r['block_mask_s']:.2f} s"
        body.append([
            f"{r['n']:,}", r.get("examples", "-"), r["path"], bu.fmt_spread(r.get("fwd_bwd_s")),
            bu.fmt_spread(r.get("fwd_s")), bu.fmt_spread(r.get("peak_mb"), digits=4),
            bu.fmt_spread(r.get("fwd_bwd_vs_blocked")), bu.fmt_spread(r.get("fwd_vs_blocked")),
            f"{r['pairs']:.3g}", note,
        ])
    return bu.markdown_table(headers, body)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="N = 4k only, 3 timed calls")
    ap.add_argument("--sizes", type=bu.int_list, help="pack lengths N (default 1k,2k,4k,8k,16k)")
    ap.add_argument("--paths", default=",".join(PATHS), help=f"comma list from {','.join(PATHS)}")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker (default 1)")
    ap.add_argument("--iters", type=int, default=5, help="timed calls per worker (default 5; quick 3)")
    ap.add_argument("--max-s", type=float, default=15.0, help="stop timing a worker after this long")
    ap.add_argument("--rounds", type=int, default=1, help="fresh-process rounds per (path, N)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds before a worker is killed")
    ap.add_argument("--in-process", action="store_true",
                    help="no worker processes (fast tests); peak memory is then not isolated")
    ap.add_argument("--out", help="results folder (default benchmarks/results, quick: runs/bench-quick)")
    args = ap.parse_args(argv)
    args.paths = bu.parse_paths(ap, args.paths, PATHS)
    if "blocked" not in args.paths:
        ap.error("--paths must include blocked (every ratio is against it)")
    if args.sizes is None:
        args.sizes = [4096] if args.quick else [1024, 2048, 4096, 8192, 16384]
    if args.quick and args.iters == 5:
        args.iters = 3
    return args


def main(argv=None) -> int:
    if bu.worker_main(sys.argv[1:] if argv is None else argv, measure):
        return 0
    args = parse_args(argv)
    before = bu.machine_info(threads=args.threads)
    t0 = time.perf_counter()
    rows = run_all(args)
    checks = check_targets(rows)
    after = bu.machine_info(threads=args.threads)
    payload = {
        "benchmark": "attention",
        "command": " ".join(["python benchmarks/attention.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine": after,
        "load": bu.load_note(before, after),
        "mix": MIX,
        "shape": {"heads": args.heads, "head_dim": args.head_dim, "dtype": "float32", "causal": True},
        "isolated": not args.in_process,
        "wall_s": time.perf_counter() - t0,
        "memory_exponent": {p: memory_exponent(rows, p) for p in args.paths},
        "rows": rows,
        "targets": checks,
    }
    path = bu.save_json(bu.out_dir(args.out, args.quick) / "attention.json", payload)
    print(f"\nwrote {path} ({payload['wall_s']:.0f} s; {payload['load']})\n")
    print(results_table(rows))
    print()
    slopes = ", ".join(f"{p} {bu.fmt_num(s)}" for p, s in payload["memory_exponent"].items())
    print(f"peak-memory log-log slope vs N (N >= 2k): {slopes}")
    print(bu.markdown_table(["target", "measured", "verdict"],
                            [[c["target"], c["measured"], bu.verdict(c["ok"])] for c in checks]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
