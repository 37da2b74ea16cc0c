"""Benchmark 4 (GPU): varlen attention kernels and the packed training step, bf16, one CUDA GPU.

One self-contained script for a CUDA machine with only torch (+ triton) and transformers
installed; packsim is imported from this checkout, no install needed. It never installs anything.

    python benchmarks/gpu.py             # N = 4k ... 64k tokens; writes benchmarks/results/gpu.json
    python benchmarks/gpu.py --quick     # N = 4k, 16k
    python benchmarks/gpu.py --plan      # what would run and which kernels are importable (no GPU needed)

Attention, for each N: q, k, v of shape (N, H, D) in bf16 over one pack of realistic example
lengths (the course's long-tailed mix; about 480 examples at 64k). Paths, each if available here:

- ``flash``: flash-attn ``flash_attn_varlen_func`` (packsim backend ``flash``);
- ``torch_varlen``: ``torch.nn.attention.varlen.varlen_attn`` (packsim backend ``torch_varlen``);
- ``flex``: ``torch.compile(flex_attention)`` with a document BlockMask (``create_block_mask``);
- ``sdpa_dense``: SDPA with the dense (N, N) block-diagonal bool mask (packsim backend ``dense``);
- ``blocked``: packsim's per-example path (what the CPU runs), in bf16;
- ``causal``: SDPA ``is_causal`` over the whole pack, the *buggy* mask: the speed reference,
  and its error shows the leak.

Each path: forward and forward + backward time (median [min-max] after warmup; flex's first
call, which compiles, is reported apart), peak CUDA memory above the inputs, and the relative
error ``||x - ref|| / ||ref||`` of the output and of dq, dk, dv against a float32 reference
(per-example SDPA in float32: packsim ``blocked``; ``ok`` within 2% for the output and 5% for
the gradients). Then the training step of ``benchmarks/throughput.py``: packed vs
one-example-per-row padded, same examples, bf16 model.

A time budget (``--budget-s``, default 390 s) skips what would not fit, so the whole script stays
under 8 minutes on one H200; skipped items are listed in the JSON and the table. ``gpu.json`` is
rewritten after each N (``"complete": false`` until the end), so a run stopped from outside
(``benchmarks/gpu_check.py`` gives it a hard time limit) keeps what it measured.
"""

from __future__ import annotations

import argparse
import sys
import time

import benchutil as bu

PATHS = ("flash", "torch_varlen", "flex", "sdpa_dense", "blocked", "causal")
PACKSIM_BACKEND = {"flash": "flash", "torch_varlen": "torch_varlen", "sdpa_dense": "dense",
                   "blocked": "blocked"}
LEAKY = {"causal"}  # expected to differ from the block-diagonal reference
DEFAULT_SIZES = [4096, 8192, 16384, 32768, 65536]
QUICK_SIZES = [4096, 16384]
REL_TOL = 2e-2  # bf16 vs float32: output within 2% (relative Frobenius norm) ...
GRAD_TOL = 5e-2  # ... and dq, dk, dv within 5% (two bf16 matmuls more; as tests/test_attention.py)
TRAIN_RESERVE_S = 60.0  # seconds kept for the training step


# ------------------------------------------------------------------------------ arguments, plan


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="N = 4k, 16k; 3 training steps")
    ap.add_argument("--plan", action="store_true", help="print what would run, then exit (no GPU needed)")
    ap.add_argument("--sizes", type=bu.int_list, help="pack lengths N (default 4k,8k,16k,32k,64k)")
    ap.add_argument("--paths", default=",".join(PATHS), help=f"comma list from {','.join(PATHS)}")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=10, help="timed calls per measurement")
    ap.add_argument("--budget-s", type=float, default=390.0, help="skip what would start after this")
    ap.add_argument("--no-train", action="store_true", help="skip the packed vs padded training step")
    ap.add_argument("--model", default="small", help="packsim model size for the training step")
    ap.add_argument("--capacity", type=int, default=4096, help="packed row length (training step)")
    ap.add_argument("--examples-per-step", type=int, default=128)
    ap.add_argument("--padded-batch", type=int, default=8, help="examples per padded micro-batch")
    ap.add_argument("--packed-rows", type=int, default=1, help="packed rows per micro-batch (0: whole step)")
    ap.add_argument("--steps", type=int, default=10, help="timed training steps (quick: 3)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda",
                    help="cuda (default); 'cpu' only checks this script's logic at tiny sizes")
    ap.add_argument("--out", help="results folder (default benchmarks/results, quick: runs/bench-quick)")
    args = ap.parse_args(argv)
    args.paths = bu.parse_paths(ap, args.paths, PATHS)
    if args.sizes is None:
        args.sizes = QUICK_SIZES if args.quick else DEFAULT_SIZES
    if args.quick and args.steps == 10:
        args.steps = 3
    for name in ("heads", "head_dim", "iters", "capacity", "examples_per_step", "padded_batch", "steps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def kernel_availability() -> dict[str, str]:
    """Why each optional kernel can or cannot run here: a reason string per path (no GPU needed)."""
    out = {}
    try:
        from flash_attn import flash_attn_varlen_func  # noqa: F401

        out["flash"] = "flash_attn importable"
    except Exception as err:  # ImportError, or an ABI mismatch raising something else
        out["flash"] = f"unavailable: flash_attn does not import ({type(err).__name__}: {err})"
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401

        out["torch_varlen"] = "torch.nn.attention.varlen.varlen_attn present"
    except ImportError as err:
        out["torch_varlen"] = f"unavailable: {err}"
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: F401

        out["flex"] = "flex_attention present (compiled with torch.compile; needs triton on CUDA)"
    except ImportError as err:
        out["flex"] = f"unavailable: {err}"
    for p in ("sdpa_dense", "blocked", "causal"):
        out[p] = "always (torch SDPA)"
    return out


def plan(args, availability: dict[str, str]) -> list[str]:
    """Human-readable lines saying what a run with ``args`` would measure."""
    lines = [f"attention, bf16, H={args.heads}, D={args.head_dim}, N = "
             + ", ".join(f"{n:,}" for n in args.sizes)]
    for p in args.paths:
        lines.append(f"  {p:13s} {availability.get(p, '?')}")
    if args.no_train:
        lines.append("training step: skipped (--no-train)")
    else:
        lines.append(f"training step: model {args.model!r} bf16, packed micro-batches of {args.packed_rows} "
                     f"row(s) of {args.capacity} vs padded micro-batches of {args.padded_batch} examples, "
                     f"{args.examples_per_step} examples/step, {args.steps} timed steps")
    lines.append(f"time budget {args.budget_s:.0f} s; float32 reference: per-example SDPA; tolerance "
                 f"{REL_TOL} (output), {GRAD_TOL} (dq, dk, dv)")
    return lines


def no_cuda_message() -> str | None:
    """None when CUDA is usable, else the one line to print before exiting (benchutil)."""
    return bu.no_cuda_message("gpu.py", "nothing was measured and no JSON was written", "Run it on a CUDA machine: python benchmarks/gpu.py (or --plan to see what it would run).")


# ------------------------------------------------------------------------------ tables (pure Python)


def attention_table(rows: list[dict]) -> str:
    headers = ["N", "examples", "path", "fwd ms", "fwd+bwd ms", "fwd+bwd / fastest", "peak GiB",
               "rel err out", "dq", "dk", "dv", "check", "note"]
    body = []
    for r in rows:
        err = r.get("rel_err", {})
        fastest = r.get("vs_fastest")
        body.append([
            f"{r['n']:,}", r.get("examples", "-"), r["path"], bu.fmt_spread(r.get("fwd_s"), 1e3),
            bu.fmt_spread(r.get("fwd_bwd_s"), 1e3),
            f"{bu.fmt_spread(fastest)} ({fastest['path']})" if fastest else "-",
            bu.fmt_num(r.get("peak_gib")), *(bu.fmt_num(err.get(k), 2) for k in ("out", "dq", "dk", "dv")),
            r.get("check", "-"), r.get("note", "")[:80],
        ])
    return bu.markdown_table(headers, body)


def training_table(summary: dict | None) -> str:
    if not summary:
        return "(training step not run)"
    headers = ["mode", "timed steps", "real tokens", "tokens incl. padding", "padding", "real tokens/s",
               "packed / padded per step"]
    body = []
    for m in ("padded", "packed"):
        s = summary[m]
        body.append([m, s["steps"], f"{s['real_tokens']:,}", f"{s['all_tokens']:,}",
                     f"{s['pad_fraction']:.1%}", f"{s['real_tokens_per_s']:,.0f}",
                     "1" if m == "padded" else bu.fmt_spread(summary["ratio"])])
    return bu.markdown_table(headers, body)


def check_label(path: str, rel_err: dict) -> str:
    """``ok`` / ``FAIL``: output within :data:`REL_TOL` and gradients within :data:`GRAD_TOL` of
    the float32 reference; the leaky causal path is expected to differ."""
    over = [k for k, v in rel_err.items() if v is not None and v > (REL_TOL if k == "out" else GRAD_TOL)]
    if path in LEAKY:
        return "differs (leak, expected)" if over else "matches?! (check the pack)"
    return "ok" if not over else "FAIL"


def build_payload(args, machine: dict, availability: dict, rows: list[dict], training: dict | None,
                  skipped: list[str], wall_s: float, command: str) -> dict:
    """The JSON written to ``gpu.json``."""
    return {
        "benchmark": "gpu",
        "command": command,
        "machine": machine,
        "availability": availability,
        "config": {"sizes": args.sizes, "paths": args.paths, "heads": args.heads, "head_dim": args.head_dim,
                   "dtype": "bfloat16", "reference": "float32 per-example SDPA (packsim blocked)",
                   "rel_tol": REL_TOL, "grad_tol": GRAD_TOL, "budget_s": args.budget_s, "model": args.model,
                   "capacity": args.capacity, "examples_per_step": args.examples_per_step,
                   "padded_batch": args.padded_batch, "packed_rows": args.packed_rows,
                   "steps": args.steps},
        "attention": rows,
        "training": training,
        "skipped": skipped,
        "wall_s": wall_s,
    }


# ------------------------------------------------------------------------------ CUDA measurements


def _sync(device):
    """A function waiting for queued kernels on ``device`` (a no-op on CPU)."""
    import torch

    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def gpu_machine_info(device) -> dict:
    import torch

    info = bu.machine_info()
    if device.type != "cuda":
        return info
    props = torch.cuda.get_device_properties(0)
    info.update(gpu=torch.cuda.get_device_name(0),
                capability=".".join(map(str, torch.cuda.get_device_capability(0))),
                gpu_mem_gib=round(props.total_memory / 2**30, 1))
    for mod in ("triton", "transformers", "flash_attn"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:  # not installed or broken: recorded as None
            info[mod] = None
    return info


def make_inputs(n: int, heads: int, head_dim: int, seed: int, device):
    """bf16 leaves q, k, v, grad (N, H, D) on ``device``, the pack offsets, and fp32 copies."""
    import torch

    lengths = bu.pack_lengths(n, seed)
    g = torch.Generator(device=device).manual_seed(seed)
    base = [torch.randn(n, heads, head_dim, device=device, generator=g) for _ in range(4)]  # fp32
    q, k, v = (t.to(torch.bfloat16).requires_grad_() for t in base[:3])
    grad = base[3].to(torch.bfloat16)
    return lengths, bu.cu_from_lengths(lengths).to(device), (q, k, v, grad), base


def reference(base, cu, max_len: int) -> dict:
    """float32 out, dq, dk, dv from per-example SDPA (packsim ``blocked``) on the bf16-rounded inputs."""
    import torch

    from packsim.core.attention import varlen_attention

    q, k, v = (t.to(torch.bfloat16).float().requires_grad_() for t in base[:3])
    grad = base[3].to(torch.bfloat16).float()
    out = varlen_attention(q, k, v, cu, cu, max_len, max_len, causal=True, backend="blocked")
    out.backward(grad)
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def make_forward(path: str, q, k, v, cu, max_len: int):
    """Forward of ``path``: () -> (N, H, D). Returns (fn, setup notes)."""
    import torch
    import torch.nn.functional as F

    from packsim.core.attention import varlen_attention

    notes: dict = {}
    if path in PACKSIM_BACKEND:
        backend = PACKSIM_BACKEND[path]
        return (lambda: varlen_attention(q, k, v, cu, cu, max_len, max_len, causal=True,
                                         backend=backend)), notes
    if path == "causal":
        def causal():
            qh, kh, vh = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # (1, H, N, D)
            return F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)[0].transpose(0, 1)
        return causal, notes
    if path == "flex":
        from torch.nn.attention.flex_attention import flex_attention

        from packsim.core.masks import flex_block_mask
        from packsim.core.segments import seq_ids_from_cu_seqlens

        sync = _sync(q.device)
        sync()
        t0 = time.perf_counter()
        block_mask = flex_block_mask(seq_ids_from_cu_seqlens(cu), causal=True, device=q.device)
        sync()
        notes["block_mask_s"] = time.perf_counter() - t0
        compiled = torch.compile(flex_attention, dynamic=False)

        def flex():
            qh, kh, vh = (t.transpose(0, 1).unsqueeze(0).contiguous() for t in (q, k, v))
            return compiled(qh, kh, vh, block_mask=block_mask)[0].transpose(0, 1)
        return flex, notes
    raise ValueError(f"unknown path {path!r}")


def rel_err(x, ref) -> float:
    return float((x.float() - ref).norm() / ref.norm().clamp_min(1e-30))


def measure_path(path: str, inputs, cu, max_len: int, ref: dict, iters: int) -> dict:
    """Time, peak memory and error of one path on one pack."""
    import torch

    q, k, v, grad = inputs
    fwd, notes = make_forward(path, q, k, v, cu, max_len)

    def fwd_bwd():
        for t in (q, k, v):
            t.grad = None
        fwd().backward(grad)

    cuda = q.device.type == "cuda"
    sync = _sync(q.device)
    t0 = time.perf_counter()
    fwd_bwd()  # first call: compiles flex; checked below
    sync()
    first_s = time.perf_counter() - t0
    errs = {"out": rel_err(fwd().detach(), ref["out"]),
            **{f"d{n}": rel_err(t.grad, ref[f"d{n}"]) for n, t in zip("qkv", (q, k, v), strict=True)}}
    for t in (q, k, v):
        t.grad = None
    peak = None
    if cuda:
        torch.cuda.empty_cache()
        sync()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fwd_bwd()
        sync()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**30
    row = {
        "path": path, "first_call_s": first_s, "peak_gib": peak, "rel_err": errs,
        "check": check_label(path, errs),
        "fwd_times": bu.time_calls(fwd, iters, warmup=1, sync=sync, max_s=5.0),
        "fwd_bwd_times": bu.time_calls(fwd_bwd, iters, warmup=1, sync=sync, max_s=5.0),
        **notes,
    }
    row["fwd_s"], row["fwd_bwd_s"] = bu.summarize(row["fwd_times"]), bu.summarize(row["fwd_bwd_times"])
    if path == "flex":
        row["note"] = f"compile+first {first_s:.1f} s, BlockMask {notes['block_mask_s']:.2f} s"
    return row


def run_attention(args, availability: dict, deadline: float, skipped: list[str],
                  on_size=lambda rows: None) -> list[dict]:
    """Every path at every N; ``on_size(rows)`` after each N (gpu.py saves partial JSON there)."""
    import torch

    device = torch.device(args.device)
    rows = []
    for n in args.sizes:
        lengths, cu, inputs, base = make_inputs(n, args.heads, args.head_dim, args.seed, device)
        ref = reference(base, cu, max(lengths))
        for path in args.paths:
            if availability[path].startswith("unavailable"):
                rows.append({"path": path, "n": n, "examples": len(lengths), "check": "skipped",
                             "note": availability[path][:70]})
                continue
            if time.perf_counter() > deadline:
                skipped.append(f"{path} N={n}: time budget")
                rows.append({"path": path, "n": n, "examples": len(lengths), "check": "skipped",
                             "note": "time budget"})
                continue
            try:
                row = measure_path(path, inputs, cu, max(lengths), ref, args.iters)
            except Exception as err:  # OOM or an unsupported shape: record it and go on
                row = {"path": path, "check": "error", "note": f"{type(err).__name__}: {err}"[:200]}
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            row.update(n=n, examples=len(lengths))
            rows.append(row)
            print(f"N={n:>6} {path:12s} {row.get('check')}: fwd+bwd "
                  f"{bu.fmt_spread(row.get('fwd_bwd_s'), 1e3)} ms {row.get('note', '')}", flush=True)
        del inputs, base, ref
        if device.type == "cuda":
            torch.cuda.empty_cache()
        add_ratios(rows)
        on_size(rows)
    return rows


def add_ratios(rows: list[dict]) -> None:
    """fwd+bwd time of each path over the fastest exact varlen kernel at the same N."""
    for n in {r["n"] for r in rows}:
        exact = [r for r in rows if r["n"] == n and r.get("check") == "ok" and r.get("fwd_bwd_times")]
        if not exact:
            continue
        best = min(exact, key=lambda r: r["fwd_bwd_s"]["median"])
        for r in rows:
            if r["n"] == n and r.get("fwd_bwd_times"):
                r["vs_fastest"] = {"path": best["path"],
                                   **bu.paired_ratio(r["fwd_bwd_times"], best["fwd_bwd_times"])}


def run_training(args) -> dict:
    import torch
    from throughput import run_modes, summarize_modes

    from packsim.core.data import make_long_tailed_examples

    device = torch.device(args.device)
    examples = make_long_tailed_examples((args.steps + 1) * args.examples_per_step, seed=args.seed)
    records = run_modes(examples, args, device=device, dtype=torch.bfloat16, sync=_sync(device))
    summary = summarize_modes(records)
    summary["records"] = records
    return summary


def main(argv=None) -> int:
    args = parse_args(argv)
    availability = kernel_availability()
    if args.plan:
        print("\n".join(plan(args, availability)))
        return 0
    if args.device.startswith("cuda"):
        msg = no_cuda_message()
        if msg:
            print(msg)
            return 0
    else:
        print(f"gpu.py on {args.device}: checking the script's logic only; these are not GPU numbers.")
    import torch

    torch.manual_seed(args.seed)
    t_start = time.perf_counter()
    reserve = 0.0 if args.no_train else TRAIN_RESERVE_S
    deadline = t_start + max(0.0, args.budget_s - reserve)
    print("\n".join(plan(args, availability)), flush=True)
    skipped: list[str] = []
    command = " ".join(["python benchmarks/gpu.py", *(sys.argv[1:] if argv is None else argv)])
    machine = gpu_machine_info(torch.device(args.device))
    json_path = bu.out_dir(args.out, args.quick) / "gpu.json"

    def save(rows, training, complete: bool):
        """gpu.json, rewritten after each N: a run stopped from outside still leaves its rows."""
        payload = build_payload(args, machine, availability, rows, training, skipped,
                                time.perf_counter() - t_start, command)
        payload["complete"] = complete
        return bu.save_json(json_path, payload)

    rows = run_attention(args, availability, deadline, skipped,
                         on_size=lambda done: save(done, None, complete=False))
    training = None
    if not args.no_train:
        try:
            training = run_training(args)
        except Exception as err:
            skipped.append(f"training step: {type(err).__name__}: {err}"[:200])
    wall = time.perf_counter() - t_start
    path = save(rows, training, complete=True)
    print(f"\nwrote {path} ({wall:.0f} s)")
    if skipped:
        print("skipped: " + "; ".join(skipped))
    print()
    print(training_table({k: v for k, v in (training or {}).items() if k != "records"} or None))
    print()
    print(attention_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

