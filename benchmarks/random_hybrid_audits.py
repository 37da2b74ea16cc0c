"""Benchmark: random audits of hybrid models against their ground truth: families x boundary fields x faults.

The hybrid families of :data:`packsim.exhibits.hybrid_traps.FRONTIER_FAMILIES` (Bamba, Qwen3-Next,
LFM2, Mamba2, Zamba2, GraniteMoeHybrid, Falcon-H1; tiny, random weights, sdpa), each on packsim's
reference kernels (``emulate_hybrid_kernels``: the conv, the Mamba2 scan and the gated delta rule
honour ``seq_idx`` / ``cu_seqlens`` as the CUDA packages do). Each audit is one packed row of 2-5
random prompt/response examples carrying restarting ``position_ids`` and one of :data:`FIELDS` (the
boundary fields a collator may add), with one of :data:`FAULTS` injected (or none), audited by
``packsim.audit(model, batch, response_mask=..., examples=..., use_cache=False)``. The ground truth
is computed here, without packsim, as ``random_audits.py`` computes it (every example's tokens
replaced in turn, the largest change of any other example's logits; the labels and every field
against the examples), with :data:`LEAK_TOL` for fp32 hybrids: their isolating rows move other
examples by round-off far below it (the JSON keeps every leak; the printout gives the largest
"isolated" one and the smallest leak, so the margin is measured, not assumed). Positions are judged
by what they do, as the audit's positions probe judges them: each example's packed logits against
the example run alone, within :data:`ALONE_TOL` (a model that reads positions only relatively, as
RoPE under a block-diagonal mask does, or not at all, as Mamba2, computes the same with positions
that do not restart; the JSON says for each row whether they restart).

A batch that needs more fields than it carries (a family whose state or attention is not kept
apart by them) leaks by the ground truth: the audit must FAIL it, which is how "which fields a
family needs" is checked at random, not only on the trap table's one row.

    python benchmarks/random_hybrid_audits.py            # 7 families x 5 fields x 5 faults x 8 seeds (1400)
    python benchmarks/random_hybrid_audits.py --quick    # 12 random cells, one seed (CI smoke)
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import warnings

import benchutil as bu
import torch
from random_audits import (
    check,
    examples,
    expected_labels,
    float64_copy,
    margin,
    run_arguments,
    seeded,
    summary,
    table,
    truth,
)

LEAK_TOL = 1e-9  # float64 truth: an isolating row moves other examples by round-off (~1e-15), a leak by far more
ALONE_TOL = 1e-4  # packed vs alone: RoPE is shift-invariant only up to the round-off of its angles (fp32)
FIELDS = ("positions", "seq_idx", "seq_idx_cu_seq_lens", "seq_idx_block_mask", "cu_seq_lens")
FAULTS = ("none", "seq_idx_late", "continuous_positions", "prompt_in_loss", "boundary_label")


def hybrid_families() -> list[str]:
    from packsim.exhibits.hybrid_traps import FRONTIER_FAMILIES

    return [f for f, spec in FRONTIER_FAMILIES.items() if spec[0] == "hybrid"]


def hybrid_batch(exs, fields: str, fault: str) -> dict:
    """One packed row (1, T): position_ids restarting per example, the ``fields``, and the ``fault``."""
    lengths = [len(ids) for ids, _ in exs]
    T = sum(lengths)
    owner = [k for k, n in enumerate(lengths) for _ in range(n)]  # each token's example
    starts = [sum(lengths[:k]) for k in range(len(lengths))]
    labels = expected_labels(exs)
    pos = [p for n in lengths for p in range(n)]
    seq_idx = list(owner)
    if fault == "seq_idx_late":  # example 1's seq_idx starts one token late
        seq_idx[starts[1]] = 0
    elif fault == "continuous_positions":
        pos = list(range(T))
    elif fault == "prompt_in_loss":
        labels = [t if k > 0 else -100 for x, _ in exs for k, t in enumerate(x)]
    elif fault == "boundary_label":
        for s in starts[1:]:
            labels[s] = exs[owner[s]][0][0]
    batch = {"input_ids": torch.tensor([[t for x, _ in exs for t in x]]), "labels": torch.tensor([labels]),
             "position_ids": torch.tensor([pos])}
    if fields.startswith("seq_idx"):
        batch["seq_idx"] = torch.tensor([seq_idx], dtype=torch.int32)  # (1, T)
    if fields.endswith("cu_seq_lens"):
        cu = torch.tensor([0, *[sum(lengths[:k + 1]) for k in range(len(lengths))]], dtype=torch.int32)  # (S+1,)
        batch.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu.clone(), max_length_q=max(lengths), max_length_k=max(lengths))
    if fields == "seq_idx_block_mask":  # 0 causal inside each example, -inf across: from seq_idx as written
        s = torch.tensor(seq_idx)
        keep = (s[:, None] == s[None, :]) & torch.ones(T, T, dtype=torch.bool).tril()  # (T, T)
        batch["attention_mask"] = torch.where(keep, 0.0, float("-inf"))[None, None]  # (1, 1, T, T)
    return batch


def one_audit(seed: int, family: str, fields: str, fault: str, models: dict) -> dict:
    import packsim
    from packsim.exhibits.hybrid_traps import build_frontier

    rng = random.Random(seed)
    if family not in models:
        model = build_frontier(family, "sdpa").eval()
        models[family] = model, float64_copy(model)  # audited in fp32, the truth in float64
    model, model64 = models[family]
    exs = examples(rng)[:5]  # 2-5 examples
    batch = hybrid_batch(exs, fields, fault)
    batch64 = {k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in batch.items()}
    gt = truth(model64, exs, batch64, rng, LEAK_TOL, ALONE_TOL, use_cache=False)
    response = torch.tensor([[k >= n for ids, n in exs for k in range(len(ids))]])  # (1, T)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = packsim.audit(model, batch, response_mask=response, examples=[ids for ids, _ in exs],
                               use_cache=False)
    model.eval()  # an audit may leave a hybrid in train mode on its way out of a fused path
    return {"seed": seed, "family": family, "fields": fields, "fault": fault, "examples": len(exs),
            "status": report.status, "failed": report.failed, "check": check(report.status, gt["bad"]),
            "seconds": time.perf_counter() - start, **gt}


def cells(args) -> list[tuple[int, str, str, str]]:
    return seeded([(f, x, fault) for f in args.families for x in args.fields for fault in args.faults], args)


def main(argv=None) -> int:
    from packsim.reference.hybrid_emulation import emulate_hybrid_kernels

    families = hybrid_families()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", nargs="+", default=families, choices=families)
    ap.add_argument("--fields", nargs="+", default=list(FIELDS), choices=list(FIELDS))
    ap.add_argument("--faults", nargs="+", default=list(FAULTS), choices=list(FAULTS))
    args = run_arguments(ap, argv, "random_hybrid_audits.json", seeds=8, cells=12)
    start, models = time.perf_counter(), {}
    with emulate_hybrid_kernels():
        rows = [one_audit(*c, models) for c in cells(args)]
    seconds = time.perf_counter() - start
    wrong = [r for r in rows if r["check"] in ("false PASS", "false FAIL")]
    path = bu.save_json(bu.out_dir(args.out, args.quick) / "random_hybrid_audits.json",
                        {"machine": bu.machine_info(1), "seconds": seconds, "leak_tol": LEAK_TOL, "rows": rows})
    print(summary(rows, seconds, path))
    print(f"{margin(rows, LEAK_TOL)}; positions that do not restart: "
          f"{sum(not r['positions_restart'] for r in rows)} rows, their largest packed-vs-alone gap where nothing "
          f"leaks {max([r['alone_gap'] for r in rows if not r['positions_restart'] and r['leak'] <= LEAK_TOL], default=0):.1e}"
          f" (ALONE_TOL {ALONE_TOL:.0e})")
    for r in wrong:
        print(f"  seed {r['seed']}: {r['family']} / {r['fields']} / {r['fault']}: audit {r['status']} "
              f"{r['failed']}, truth leak {r['leak']:.1e} alone gap {r['alone_gap']:.1e} labels_ok {r['labels_ok']} "
              f"fields_ok {r['fields_ok']} positions restart {r['positions_restart']}")
    for key in ("fault", "fields", "family"):
        print()
        print(table(rows, key, LEAK_TOL))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
