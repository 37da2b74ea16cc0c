"""The isolation verdicts of ``benchmarks/reference_kernels.py``: packed tiny models on the reference
kernels (packsim, pure torch) and, where present, on the real ones, per dtype.

Each verdict is the largest logit change of any example of a packed batch against the same
example run alone (same weights, same dtype, same device): ``isolates`` within :data:`ISO_TOL` of
the dtype, ``leaks`` above :data:`LEAK_MIN`, ``unclear`` between; ``as expected`` when it is the
known answer (ground truth of the trap table and the hybrid frontier, tests/test_reference_flash_emulation.py
and tests/test_reference_hybrid_emulation.py):

- a tiny Llama (:func:`packsim.exhibits.trap_cases.build_family`) on transformers' flash path,
  alone through eager: one row (1, 32) with restarting ``position_ids`` isolates; two rows (2, 32)
  leak (``_is_packed_sequence`` looks at batch size 1 only); ``cu_seq_lens_q/k`` fix them. On the
  reference kernel and, where flash-attn imports (fp16/bf16), the real one: ``vs_reference`` is the
  largest logit difference between the two;
- a tiny Bamba (:func:`packsim.exhibits.hybrid_traps.build_frontier`), one packed row (1, 32),
  alone through the same model: ``position_ids`` only leaks (the conv and the scan run across
  boundaries), ``seq_idx`` isolates, in eval and in train mode (the fused kernel). On the
  references (forced in, even where transformers bound a real package) and, where it bound one,
  on that package (references where it did not).
"""

from __future__ import annotations

import copy
import inspect
import sys
import time

import benchutil as bu
import torch

ISO_TOL = {"bfloat16": 2e-2, "float16": 5e-3, "float32": 1e-4}  # logit change: isolated ...
LEAK_MIN = 5e-2  # ... leaked (these tiny models leak by 0.13-0.26 in every dtype)


def _change(alone, logits, ids, seq) -> float:
    """Max |packed logits - the example run alone through ``alone`` (a model)| over every example.
    logits (n, T, V); ids, seq (n, T)."""
    return max(float((logits[b, seq[b] == e] - alone(input_ids=ids[b, seq[b] == e][None], use_cache=False)
                      .logits[0].float()).abs().max()) for b in range(logits.shape[0]) for e in seq[b].unique().tolist())


def _verdict_row(model, kernel, dname, condition, expected, change, error=None, real=False, **extra) -> dict:
    """One verdict; an error is UNEXPECTED on the references, "not compared" on a real package (reported only)."""
    verdict = (f"error: {error}"[:300] if error else "isolates" if change <= ISO_TOL[dname]
               else "leaks" if change > LEAK_MIN else "unclear")
    check = "as expected" if verdict == expected else "not compared" if error and real else "UNEXPECTED"
    return {"model": model, "kernel": kernel, "dtype": dname, "condition": condition, "expected": expected,
            "change": change, "verdict": verdict, "check": check, **extra}


def llama_verdicts(dtypes, args, device, deadline, skipped) -> list[dict]:
    """A tiny Llama packed through transformers' flash path: the reference kernel, and the real one where present."""
    from packsim.core.segments import cu_seqlens_from_lengths, example_positions
    from packsim.exhibits.trap_cases import ROWS, VOCAB, build_family
    from packsim.reference.flash import REFERENCE_KERNEL
    from packsim.reference.flash_emulation import REAL_NAME, emulate_flash, real_flash_attn

    ids = torch.randint(3, VOCAB, (2, 32), generator=torch.Generator().manual_seed(args.seed)).to(device)  # (2, 32)
    seq = torch.stack([torch.repeat_interleave(torch.arange(len(r)), torch.tensor(r)) for r in ROWS]).to(device)
    pos = example_positions(seq)  # (2, 32): restarting per example
    cu = cu_seqlens_from_lengths([n for r in ROWS for n in r]).to(device)  # (7,) over the 2 x 32 tokens
    longest = max(max(r) for r in ROWS)
    fix = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest)
    conditions = [("one row, position_ids restart", 1, {}, "isolates"),
                  ("two rows, position_ids restart, no cu_seq_lens", 2, {}, "leaks"),
                  ("two rows + cu_seq_lens_q/k (the fix)", 2, fix, "isolates")]
    real = real_flash_attn() if device.type == "cuda" else None
    base, rows = build_family("llama", "eager"), []
    for dname in dtypes:
        eager = copy.deepcopy(base).to(device, getattr(torch, dname))
        kernels = [(emulate_flash(force_reference=True).name, REFERENCE_KERNEL)]
        kernels += [(REAL_NAME, real)] if real and dname != "float32" else []  # flash-attn: fp16/bf16 only
        first = {}
        for impl, label in kernels:
            if time.perf_counter() > deadline:
                skipped.append(f"llama {label} {dname}: time budget")
                continue
            model = copy.deepcopy(eager)
            for cond, n, extra, expected in conditions:
                try:
                    model.set_attn_implementation(impl)
                    with torch.no_grad():
                        logits = model(input_ids=ids[:n], position_ids=pos[:n], use_cache=False, **extra).logits.float()
                        change = _change(eager, logits, ids[:n], seq[:n])
                except Exception as err:  # e.g. a flash-attn build this transformers refuses
                    rows.append(_verdict_row("llama (flash path)", label, dname, cond, expected, None,
                                             f"{type(err).__name__}: {err}", real=impl == REAL_NAME))
                    continue
                vs = {"vs_reference": float((logits - first[cond]).abs().max())} if cond in first else {}
                first.setdefault(cond, logits)
                rows.append(_verdict_row("llama (flash path)", label, dname, cond, expected, change, **vs))
    return rows


def _forced_reference(module):
    """Every kernel site of ``module`` packsim has a reference for calls the reference, even where transformers
    bound the real package (as :func:`~packsim.reference.hybrid_emulation.emulate_hybrid_kernels` wires a missing
    one); returns the function that puts back what was there."""
    from packsim.core.upstream.hub_kernels import restore, swap, wrapper_cells
    from packsim.reference import hybrid_emulation as rh

    saved, seen = [], set()
    for site in rh.kernel_sites([module]):
        ref = rh.REFERENCES.get(site.func_name)
        if ref is None or id(site.wrapper) in seen:
            continue
        seen.add(id(site.wrapper))
        cells = wrapper_cells(site.wrapper)
        saved.append((cells, swap(cells, ref[1], tuple(inspect.signature(ref[1]).parameters))))

    def put_back():
        for cells, before in reversed(saved):
            restore(cells, before)
    return put_back


def bamba_verdicts(dtypes, args, device, deadline, skipped) -> list[dict]:
    """A tiny Bamba, one packed row, with and without seq_idx: the references, and the real packages where bound."""
    from packsim.exhibits.hybrid_traps import build_frontier, frontier_batch
    from packsim.reference.hybrid_emulation import emulate_hybrid_kernels, kernels_in_use

    base = build_frontier("bamba")
    module = sys.modules[type(base).__module__]
    batch, seq = frontier_batch("seq_idx", seed=args.seed)
    batch, seq = {k: v.to(device) for k, v in batch.items()}, seq.to(device)
    plain = {k: v for k, v in batch.items() if k != "seq_idx"}
    conditions = [("position_ids only", plain, False, "leaks"), ("seq_idx", batch, False, "isolates"),
                  ("seq_idx, train mode (the fused kernel)", batch, True, "isolates")]
    watched = ("causal_conv1d_fn", "mamba_chunk_scan_combined", "mamba_split_conv1d_scan_combined")
    real_bound = device.type == "cuda" and any("real package" in kernels_in_use(module).get(k, "") for k in watched)
    runs = [("reference", _forced_reference)]  # then, where a real package is bound: it, references elsewhere
    runs += [("as transformers bound them", lambda m: emulate_hybrid_kernels([m]).undo)] if real_bound else []
    rows = []
    for dname in dtypes:
        model = copy.deepcopy(base).to(device, getattr(torch, dname))
        for run, wire in runs:
            if time.perf_counter() > deadline:
                skipped.append(f"bamba {run} {dname}: time budget")
                continue
            undo = wire(module)
            try:
                found = [kernels_in_use(module).get(k, "-") for k in watched]
                label = found[0] if len(set(found)) == 1 else "; ".join(map(": ".join, zip(watched, found, strict=True)))
                for cond, fields, train, expected in conditions:
                    model.train(train)
                    change, error = None, None
                    try:
                        with torch.no_grad():
                            logits = model(**fields, use_cache=False).logits.float()
                            change = _change(model, logits, fields["input_ids"], seq)
                    except Exception as err:
                        error = f"{type(err).__name__}: {err}"
                    rows.append(_verdict_row("bamba (seq_idx)", label, dname, cond, expected, change, error,
                                             real=run != "reference", run=run))
            finally:
                model.eval()
                undo()
    return rows


def verdict_table(rows: list[dict]) -> str:
    body = [[r["model"], r["kernel"], r["dtype"], r["condition"], bu.fmt_num(r["change"]),
             r["verdict"] + (f" (vs reference {bu.fmt_num(r['vs_reference'])})" if "vs_reference" in r else ""),
             r["check"]] for r in rows]
    return bu.markdown_table(["model", "kernel", "dtype", "condition", "change vs alone", "verdict", "check"], body)
