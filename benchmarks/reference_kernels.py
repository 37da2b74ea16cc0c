"""packsim's reference kernels against the real ones on one CUDA GPU: outputs per dtype, and the
isolation verdicts of a packed tiny Llama (flash path) and a tiny Bamba (``seq_idx``).

    python benchmarks/reference_kernels.py                       # writes benchmarks/results/reference_kernels.json
    python benchmarks/reference_kernels.py --device cpu --tiny   # this script's logic only (not GPU numbers)

For a CUDA machine with torch (+ triton) and transformers; packsim comes from this checkout.
``make gpu-check`` runs it as its ``reference_kernels`` part. Each row says what it was compared
with; no comparison is claimed that was not made.

1. Kernels, on random seeded inputs (fp32 on CPU, cast to each dtype on the device; A, D, dt_bias
   and the delta rule's g stay fp32, as the models pass them): ``flash_attn_varlen_func`` (varlen
   segments, GQA: causal, a sliding window, softcap, bidirectional with a window) and
   ``flash_attn_func`` (q shorter than k, causal) in bf16 and fp16 (flash-attn takes no fp32);
   ``causal_conv1d_fn`` (``seq_idx``, channel-last; without) and ``causal_conv1d_update``;
   ``mamba_chunk_scan_combined`` (``seq_idx``; varlen states with ``cu_seqlens``) and
   ``mamba_split_conv1d_scan_combined`` (``seq_idx``); ``chunk_gated_delta_rule`` and
   ``fused_recurrent_gated_delta_rule`` (``cu_seqlens``), in bf16, fp16 and fp32. Against the real
   package where it imports (flash-attn, causal-conv1d, mamba-ssm, flash-linear-attention); where
   it does not, the row says "real package not installed (...): compared with <path> instead":
   torch SDPA on the device per segment for flash (dense fp32 torch math for softcap, which SDPA
   lacks), and for the hybrid kernels the reference's own fp32 run on CPU (dtype faithfulness,
   not the real kernel). Errors: max |x - y| over every output (outputs and states) and that over
   max |y| ("max rel"); ``ok`` within :data:`TOL` of the dtype.
2. Isolation verdicts: the largest logit change of any example of a packed batch against the
   same example run alone (same weights and dtype; Llama: eager, Bamba: the same model). A tiny
   Llama on transformers' flash path (one row with restarting positions isolates, two rows leak,
   ``cu_seq_lens_*`` fixes them) on the reference kernel and, where flash-attn imports, the real
   one (with the largest logit difference between the two); a tiny Bamba with and without
   ``seq_idx`` (eval, and train mode: the fused kernel) on the references and, where transformers
   bound a real package, on it (``benchmarks/reference_verdicts.py``).

Every section runs in bf16 first, then fp16, then fp32; a time budget (``--budget-s``) skips what
would start too late (listed in the JSON), which is rewritten after each section. Exit status 1
when a check differs, a verdict is not the expected one or a reference kernel fails; a real kernel
that raises is reported ("not compared"), not counted. Without CUDA (and no ``--device cpu``):
one line, exit 0.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
import time
import warnings

import benchutil as bu
import torch
import torch.nn.functional as F
from reference_verdicts import ISO_TOL, LEAK_MIN, bamba_verdicts, llama_verdicts, verdict_table

SECTIONS = ("flash", "llama", "conv", "ssm", "bamba", "delta")  # each verdict after its kernels
DTYPES = ("bfloat16", "float16", "float32")
# section -> (import name, distribution) of the real package
REAL = {"flash": ("flash_attn", "flash-attn"), "conv": ("causal_conv1d", "causal-conv1d"),
        "ssm": ("mamba_ssm", "mamba-ssm"), "delta": ("fla", "flash-linear-attention")}
TOL = {"bfloat16": 3e-2, "float16": 5e-3, "float32": 2e-3}  # max abs / max |y| (fp32: triton's tf32)
# full (GPU) and tiny (--tiny, the CPU logic check). The real causal_conv1d takes seq_idx only on channel-last
# x with strides that are multiples of 8: dim 64, and the fused Mamba2 row 2*128 + 2*16 + 8 = 296 wide
SIZES = {
    False: dict(lengths=[37, 128, 5, 211, 64, 1], heads=8, kv_heads=2, head_dim=64, dense=(2, 48, 160), window=16,
                rows=[[37, 90, 33], [64, 1, 95]], dim=64, width=4, ssm_heads=8, headdim=16, dstate=16, chunk=64),
    True: dict(lengths=[5, 12, 1, 9], heads=4, kv_heads=2, head_dim=16, dense=(2, 5, 11), window=4,
               rows=[[5, 12, 7], [10, 1, 13]], dim=8, width=4, ssm_heads=2, headdim=4, dstate=4, chunk=16),
}
KERNELS = {"flash": ("flash_attn", ("flash_attn_func", "flash_attn_varlen_func")),
           "conv": ("causal_conv1d", ("causal_conv1d_fn", "causal_conv1d_update")),
           "ssm": ("mamba_ssm.ops.triton.ssd_combined", ("mamba_chunk_scan_combined", "mamba_split_conv1d_scan_combined")),
           "delta": ("fla.ops.gated_delta_rule", ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"))}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default); 'cpu' only checks this script's logic")
    ap.add_argument("--tiny", action="store_true", help="tiny sizes (the CPU logic check)")
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma list from {','.join(SECTIONS)}")
    ap.add_argument("--dtypes", default=",".join(DTYPES), help=f"comma list from {','.join(DTYPES)}")
    ap.add_argument("--budget-s", type=float, default=80.0, help="skip what would start after this")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="results folder (default benchmarks/results)")
    args = ap.parse_args(argv)
    args.sections = bu.parse_paths(ap, args.sections, SECTIONS)
    args.dtypes = bu.parse_paths(ap, args.dtypes, DTYPES)
    return args


# ------------------------------------------------------------------------------ the kernels


def real_kernels(section: str, device: torch.device) -> tuple[dict | None, str]:
    """({kernel name: the real package's function} or None, what they are or why there are none)."""
    package, dist = REAL[section]
    if device.type != "cuda":
        return None, f"{dist} runs on CUDA only (this run is on {device})"
    path, names = KERNELS[section]
    try:
        module = __import__(path, fromlist=list(names))
        fns = {name: getattr(module, name) for name in names}
    except ModuleNotFoundError as err:
        if (err.name or "").split(".")[0] == package:
            return None, f"real package not installed ({dist})"
        return None, f"real package does not import ({dist}: {err})"
    except Exception as err:  # installed but broken (a CUDA / ABI mismatch, a renamed function): say so
        return None, f"real package does not import ({dist}: {type(err).__name__}: {err})"
    try:
        version = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        version = getattr(sys.modules.get(package), "__version__", "(version unknown)")
    return fns, f"{dist} {version}"


def references() -> dict:
    """{kernel name: packsim's reference kernel (pure torch)}."""
    from packsim.reference import conv as reference_conv
    from packsim.reference import delta as reference_delta
    from packsim.reference import flash as reference_flash
    from packsim.reference import ssm as reference_ssm

    mods = {"flash": reference_flash, "conv": reference_conv, "ssm": reference_ssm, "delta": reference_delta}
    return {name: getattr(mods[s], name) for s, (_, names) in KERNELS.items() for name in names}


def cast(inputs: dict, dtype: torch.dtype, device, keep=()) -> dict:
    """Fresh copies on ``device``: float tensors in ``dtype`` (those named in ``keep``: fp32), others as they are."""
    def one(name, t):
        if not isinstance(t, torch.Tensor):
            return t
        want = (torch.float32 if name in keep else dtype) if t.is_floating_point() else t.dtype
        return t.to(device=device, dtype=want, copy=True)
    return {name: one(name, t) for name, t in inputs.items()}


def errors(out, other) -> dict:
    """{"max_abs", "max_rel"} over every output pair (None skipped); max_rel: max abs / max |other|."""
    outs, others = ((x if isinstance(x, (tuple, list)) else (x,)) for x in (out, other))
    if len(outs) != len(others):
        raise ValueError(f"{len(outs)} outputs against {len(others)}")
    max_abs = max_rel = 0.0
    for a, b in zip(outs, others, strict=True):
        if a is None or b is None:
            continue
        a, b = a.detach().float().cpu(), b.detach().float().cpu()
        if a.shape != b.shape:
            raise ValueError(f"output shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
        diff = float((a - b).abs().max()) if a.numel() else 0.0
        scale = float(b.abs().max()) if b.numel() else 0.0
        max_abs, max_rel = max(max_abs, diff), max(max_rel, diff / max(scale, 1e-12))
    return {"max_abs": max_abs, "max_rel": max_rel}


def _segment_ids(lengths) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)).to(torch.int32)  # (T,)


def _cu(lengths) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)  # (S+1,)


def _visible(lq: int, lk: int, causal: bool, window, device) -> torch.Tensor:
    """(lq, lk) bool, flash-attn 2's documented rule: causal aligned bottom-right, window (left, right), -1 = none."""
    i, j = torch.arange(lq, device=device)[:, None], torch.arange(lk, device=device)[None]
    left, right = window[0], 0 if causal else window[1]
    ok = torch.ones(lq, lk, dtype=torch.bool, device=device)
    if right >= 0:
        ok &= j <= i + (lk - lq) + right
    if left >= 0:
        ok &= j >= i + (lk - lq) - left
    return ok


def _attend_torch(q, k, v, causal=False, window=(-1, -1), softcap=0.0):
    """One segment in torch: q (Lq, H, D), k/v (Lk, H_kv, D) -> (Lq, H, D). SDPA; fp32 math for softcap."""
    rep = q.shape[1] // k.shape[1]
    qh = q.transpose(0, 1)[None]  # (1, H, Lq, D)
    kh, vh = (t.transpose(0, 1).repeat_interleave(rep, 0)[None] for t in (k, v))  # (1, H, Lk, D)
    mask = _visible(q.shape[0], k.shape[0], causal, window, q.device)  # (Lq, Lk)
    if not softcap:
        return F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)[0].transpose(0, 1)
    s = (qh.float() @ kh.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
    s = (softcap * torch.tanh(s / softcap)).masked_fill(~mask, float("-inf"))
    return (s.softmax(-1) @ vh.float()).to(q.dtype)[0].transpose(0, 1)


# ------------------------------------------------------------------------------ the kernel cases
# each case: kernel, name, make (generator -> fp32 CPU inputs), call (kernel, inputs -> outputs),
# keep (inputs kept fp32), dtypes; flash cases also torch (inputs -> outputs) and torch_label


def flash_cases(S):
    H, Hk, D, w = S["heads"], S["kv_heads"], S["head_dim"], S["window"]
    cu, L, (B, tq, tk) = _cu(S["lengths"]), max(S["lengths"]), S["dense"]
    T = int(cu[-1])

    def varlen(g, q_scale=1.0):  # q_scale 3: scores of a few units, so a cap of 3 bends them
        return dict(q=torch.randn(T, H, D, generator=g) * q_scale, k=torch.randn(T, Hk, D, generator=g),
                    v=torch.randn(T, Hk, D, generator=g), cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=L,
                    max_seqlen_k=L)

    def per_segment(opts):
        def run(x):
            c = x["cu_seqlens_q"].tolist()
            return torch.cat([_attend_torch(x["q"][a:b], x["k"][a:b], x["v"][a:b], opts.get("causal", False),
                                            opts.get("window_size", (-1, -1)), opts.get("softcap", 0.0))
                              for a, b in zip(c[:-1], c[1:], strict=True)])
        return run

    cases = [dict(kernel="flash_attn_varlen_func", name=name, make=lambda g, s=scale: varlen(g, s),
                  call=lambda f, x, o=opts: f(**x, **o), torch=per_segment(opts),
                  torch_label="dense fp32 torch math" if opts.get("softcap") else "torch SDPA, per segment")
             for name, scale, opts in (("varlen GQA causal", 1.0, dict(causal=True)),
                                       (f"varlen GQA causal window ({w}, 0)", 1.0, dict(causal=True, window_size=(w, 0))),
                                       ("varlen GQA causal softcap 3", 3.0, dict(causal=True, softcap=3.0)),
                                       (f"varlen GQA bidirectional window ({w // 2}, {w // 2})", 1.0,
                                        dict(window_size=(w // 2, w // 2))))]
    cases.append(dict(kernel="flash_attn_func", name=f"q shorter than k ({tq} < {tk}) GQA causal",
                      make=lambda g: dict(q=torch.randn(B, tq, H, D, generator=g), k=torch.randn(B, tk, Hk, D, generator=g),
                                          v=torch.randn(B, tk, Hk, D, generator=g)),
                      call=lambda f, x: f(**x, causal=True), torch_label="torch SDPA, per row (bottom-right causal mask)",
                      torch=lambda x: torch.stack([_attend_torch(x["q"][b], x["k"][b], x["v"][b], True) for b in range(B)])))
    return [{**c, "dtypes": ("bfloat16", "float16")} for c in cases]  # flash-attn: fp16/bf16 only


def conv_cases(S):
    rows, Dm, W = S["rows"], S["dim"], S["width"]

    def packed(g):  # x (B, T, D): the kernel gets x.transpose(1, 2), channel-last, as transformers passes it
        return dict(x=torch.randn(len(rows), sum(rows[0]), Dm, generator=g), weight=torch.randn(Dm, W, generator=g) / W,
                    bias=torch.randn(Dm, generator=g), seq_idx=torch.stack([_segment_ids(r) for r in rows]))

    def step(g):
        return dict(x=torch.randn(len(rows), Dm, generator=g), conv_state=torch.randn(len(rows), Dm, W - 1, generator=g),
                    weight=torch.randn(Dm, W, generator=g) / W, bias=torch.randn(Dm, generator=g))

    def update(f, x):
        return f(x["x"], x["conv_state"], x["weight"], x["bias"], activation="silu"), x["conv_state"]  # state: in place

    return [dict(kernel="causal_conv1d_fn", name="seq_idx, 2 packed rows, silu", make=packed,
                 call=lambda f, x: f(x["x"].transpose(1, 2), x["weight"], x["bias"], seq_idx=x["seq_idx"],
                                     activation="silu")),
            dict(kernel="causal_conv1d_fn", name="no seq_idx, silu", make=packed,
                 call=lambda f, x: f(x["x"].transpose(1, 2).contiguous(), x["weight"], x["bias"], activation="silu")),
            dict(kernel="causal_conv1d_update", name="one decode step (out, state)", make=step, call=update)]


def ssm_cases(S):
    rows, h, p, n, Q = S["rows"], S["ssm_heads"], S["headdim"], S["dstate"], S["chunk"]
    T, b, dim = sum(rows[0]), len(rows), S["ssm_heads"] * S["headdim"]

    def heads(g):
        return dict(A=-torch.rand(h, generator=g) - 0.5, D=torch.randn(h, generator=g),
                    dt_bias=torch.randn(h, generator=g) * 0.1)

    def scan(g, nrows=b):
        return dict(x=torch.randn(nrows, T, h, p, generator=g), dt=torch.randn(nrows, T, h, generator=g) - 1,
                    B=torch.randn(nrows, T, 1, n, generator=g), C=torch.randn(nrows, T, 1, n, generator=g),
                    seq_idx=torch.stack([_segment_ids(r) for r in rows[:nrows]]), cu_seqlens=_cu(rows[0]), **heads(g))

    def fused(g):
        return dict(zxbcdt=torch.randn(b, T, 2 * dim + 2 * n + h, generator=g),
                    conv1d_weight=torch.randn(dim + 2 * n, S["width"], generator=g) / 2,
                    conv1d_bias=torch.randn(dim + 2 * n, generator=g) * 0.1, **heads(g),
                    seq_idx=torch.stack([_segment_ids(r) for r in rows]),
                    rmsnorm_weight=1 + torch.randn(dim, generator=g) / 4,
                    outproj_weight=torch.randn(32, dim, generator=g) / dim ** 0.5)

    def chunk(f, x, **varlen):
        return f(x["x"], x["dt"], x["A"], x["B"], x["C"], Q, D=x["D"], dt_bias=x["dt_bias"], seq_idx=x["seq_idx"],
                 dt_softplus=True, **varlen)

    def split(f, x):
        return f(x["zxbcdt"], x["conv1d_weight"], x["conv1d_bias"], x["dt_bias"], x["A"], x["D"], Q,
                 seq_idx=x["seq_idx"], rmsnorm_weight=x["rmsnorm_weight"], rmsnorm_eps=1e-6,
                 outproj_weight=x["outproj_weight"], headdim=p, ngroups=1, norm_before_gate=False)

    keep = ("A", "D", "dt_bias")  # fp32, as the models pass A = -exp(A_log.float())
    return [dict(kernel="mamba_chunk_scan_combined", name="seq_idx, 2 packed rows, D, dt_bias, softplus", make=scan,
                 call=chunk, keep=keep),
            dict(kernel="mamba_chunk_scan_combined", name="varlen states (b=1, cu_seqlens; out, states)",
                 make=lambda g: scan(g, 1), keep=keep,
                 call=lambda f, x: chunk(f, x, cu_seqlens=x["cu_seqlens"], return_varlen_states=True)),
            dict(kernel="mamba_split_conv1d_scan_combined", name="seq_idx, gated RMSNorm, out_proj", make=fused,
                 call=split, keep=keep)]


def delta_cases(S):
    lengths, H, K = S["rows"][0], S["ssm_heads"], 2 * S["headdim"]
    T = sum(lengths)

    def make(g):
        return dict(q=torch.randn(1, T, H, K, generator=g), k=torch.randn(1, T, H, K, generator=g),
                    v=torch.randn(1, T, H, K, generator=g), g=-F.softplus(torch.randn(1, T, H, generator=g)) / 4,
                    beta=torch.rand(1, T, H, generator=g), cu_seqlens=_cu(lengths))

    def call(f, x):
        return f(x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"], cu_seqlens=x["cu_seqlens"], output_final_state=True,
                 use_qk_l2norm_in_kernel=True)

    return [dict(kernel=k, name=f"cu_seqlens ({len(lengths)} sequences), qk l2norm (out, final states)", make=make,
                 call=call, keep=("g",)) for k in KERNELS["delta"][1]]


CASES = {"flash": flash_cases, "conv": conv_cases, "ssm": ssm_cases, "delta": delta_cases}


def run_kernel_section(section, dtypes, args, device, deadline, skipped) -> dict:
    """Every case of ``section`` in ``dtypes``: the reference against the real kernel or a torch path."""
    real, label = real_kernels(section, device)
    refs, rows = references(), []
    for case in CASES[section](SIZES[args.tiny]):
        for dname in [d for d in dtypes if d in case.get("dtypes", DTYPES)]:
            if time.perf_counter() > deadline:
                skipped.append(f"{case['kernel']} {case['name']} {dname}: time budget")
                continue
            dtype, keep = getattr(torch, dname), case.get("keep", ())
            base = case["make"](torch.Generator().manual_seed(args.seed))  # fp32 on CPU
            row = {"section": section, "kernel": case["kernel"], "case": case["name"], "dtype": dname, "tol": TOL[dname]}
            try:
                out = case["call"](refs[case["kernel"]], cast(base, dtype, device, keep))
            except Exception as err:
                rows.append({**row, "against": "-", "check": f"FAIL: the reference raised {type(err).__name__}: {err}"})
                continue
            try:
                if real is not None:
                    row["against"] = f"{label} (the real kernel)"
                    other = case["call"](real[case["kernel"]], cast(base, dtype, device, keep))
                elif "torch" in case:
                    row["against"] = f"{label}: compared with {case['torch_label']} on {device} instead"
                    other = case["torch"](cast(base, dtype, device, keep))
                else:
                    row["against"] = f"{label}: compared with the reference's own float32 run on CPU instead"
                    other = case["call"](refs[case["kernel"]], cast(base, torch.float32, "cpu"))
            except Exception as err:
                rows.append({**row, "check": f"not compared: it raised {type(err).__name__}: {err}"[:300]})
                continue
            try:
                row.update(errors(out, other))
            except ValueError as err:
                rows.append({**row, "check": f"FAIL: the outputs do not line up: {err}"})
                continue
            rows.append({**row, "check": "ok" if row["max_rel"] <= row["tol"] else "differs"})
    return {"real": label, "rows": rows}


# ------------------------------------------------------------------------------ tables, main


def kernel_table(sections: dict) -> str:
    body = [[r["kernel"], r["case"], r["dtype"], r["against"], bu.fmt_num(r.get("max_abs")),
             bu.fmt_num(r.get("max_rel")), r["check"]] for s in sections.values() for r in s["rows"]]
    return bu.markdown_table(["kernel", "case", "dtype", "compared with", "max abs", "max rel", "check"], body)


def problems(payload: dict) -> list[str]:
    """What makes the exit status 1: a check that differs or failed, a verdict not the expected one."""
    bad = [f"{r['kernel']} {r['case']} {r['dtype']}: {r['check']}" for s in payload["sections"].values()
           for r in s["rows"] if r["check"] == "differs" or r["check"].startswith("FAIL")]
    return bad + [f"{r['model']} {r['condition']} {r['dtype']}: {r['verdict']}" for r in payload["verdicts"]
                  if r["check"] == "UNEXPECTED"]


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        msg = bu.no_cuda_message("reference_kernels", "nothing was run",
                                 "Run it on a CUDA machine (--device cpu --tiny checks its logic).")
        if msg:
            print(msg)
            return 0
    else:
        print(f"reference_kernels on {device}: checking this script's logic only; these are not GPU numbers.")
    import gpu  # benchmarks/gpu.py: the machine description
    import transformers

    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    t0 = time.perf_counter()
    deadline = t0 + args.budget_s
    out = bu.out_dir(args.out, quick=False) / "reference_kernels.json"
    skipped: list[str] = []
    payload = {"benchmark": "reference_kernels",
               "command": " ".join(["python benchmarks/reference_kernels.py", *(sys.argv[1:] if argv is None else argv)]),
               "machine": gpu.gpu_machine_info(device), "device": str(device), "tiny": args.tiny,
               "tol": TOL, "iso_tol": ISO_TOL, "leak_min": LEAK_MIN, "sections": {}, "verdicts": [],
               "skipped": skipped, "complete": False}
    for dname in args.dtypes:  # every section in bf16 first: what a tight budget keeps
        for section in args.sections:
            print(f"--- {section} {dname}", flush=True)
            try:
                if section in CASES:
                    done = run_kernel_section(section, [dname], args, device, deadline, skipped)
                    into = payload["sections"].setdefault(section, {"real": done["real"], "rows": []})
                    into["rows"] += done["rows"]
                elif section == "llama":
                    payload["verdicts"] += llama_verdicts([dname], args, device, deadline, skipped)
                else:
                    payload["verdicts"] += bamba_verdicts([dname], args, device, deadline, skipped)
            except Exception as err:  # a model that does not build here: reported, the next section runs
                payload["verdicts"].append({"model": section, "kernel": "-", "dtype": dname, "condition": "-",
                                            "expected": "-", "change": None, "check": "UNEXPECTED",
                                            "verdict": f"error: {type(err).__name__}: {err}"[:300]})
            payload["wall_s"] = time.perf_counter() - t0
            bu.save_json(out, payload)
    payload["complete"] = True
    bad = problems(payload)
    payload["problems"] = bad
    bu.save_json(out, payload)
    print(f"\nwrote {out} ({payload['wall_s']:.0f} s)" + (f"; skipped: {len(skipped)}" if skipped else "")
          + (f"; problems: {'; '.join(bad)}" if bad else ""))
    print("\n" + kernel_table(payload["sections"]))
    if payload["verdicts"]:
        print("\n" + verdict_table(payload["verdicts"]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
