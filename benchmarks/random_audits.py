"""Benchmark: random audits against their ground truth (issue 39): families x attention paths x faults.

Each audit is one packed batch of 2-6 random prompt/response examples of a tiny model built from a
transformers config (nine families, :data:`FAMILIES`), through one attention path (eager, sdpa, or
transformers' flash path on packsim's reference kernel where no flash-attn runs) with one of the
:data:`FAULTS` injected (or none), audited by ``packsim.audit(model, batch, response_mask=...,
examples=...)`` (or, :data:`EVIDENCE` "tokens", without ``examples``: the audit finds them by their BOS).
The ground truth is computed here, without packsim:

- **leak**: every example's content tokens are replaced (seeded), one example at a time, and the
  largest change of any other example's logits through ``model(**batch)`` is taken, on a float64
  copy of the audited fp32 model; above :data:`LEAK_TOL` the batch leaks (the summary prints the
  largest change of an isolated row and the smallest leak, so the margin is measured, not assumed);
- **labels**: the batch's labels against the ones written here from the examples (prompt -100, each
  example's first label -100, response and EOS counted);
- **fields**: ``cu_seq_lens_q/k`` against the cumulative example lengths, ``max_length_q/k`` against
  the longest example, ``position_ids`` against the restarts at each example.

A batch is bad when any of the three says so. ``agrees`` when the audit FAILs a bad batch or PASSes
a good one; ``false PASS`` / ``false FAIL`` otherwise; "not measured" and "unverified" are counted
apart (an honest non-verdict, never a pass). Every audit's seed, family, path, fault and verdict is
kept in the JSON, so any one can be rerun (``--only SEED``).

    python benchmarks/random_audits.py                 # 9 families x 3 paths x 8 conditions x 2 evidences x 2 seeds
    python benchmarks/random_audits.py --quick         # 24 random cells, one seed (CI smoke)
"""

from __future__ import annotations

import argparse
import copy
import random
import sys
import time
import warnings
from collections import Counter

import benchutil as bu
import torch

LEAK_TOL = 1e-9  # float64 truth: an isolating forward moves other examples by round-off (~1e-15), a leak by far more
VOCAB, BOS, EOS = 96, 1, 2
_TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=128, vocab_size=VOCAB, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=0)
# family -> (transformers config class, extra config kwargs)
FAMILIES = {
    "llama": ("LlamaConfig", {}), "qwen2": ("Qwen2Config", {}), "qwen3": ("Qwen3Config", {"head_dim": 8}),
    "mistral": ("MistralConfig", {"sliding_window": None}), "gemma": ("GemmaConfig", {"head_dim": 8}),
    "phi3": ("Phi3Config", {}), "olmo2": ("Olmo2Config", {}), "smollm3": ("SmolLM3Config", {}),
    "granite": ("GraniteConfig", {}),
}
PATHS = ("eager", "sdpa", "flash")
EVIDENCE = ("examples", "tokens")  # examples= given to the audit, or only the BOS each example starts with
FAULTS = ("none", "continuous_positions", "late_restart", "prompt_in_loss", "boundary_label", "eos_not_counted",
          "cu_seq_lens_off", "stale_max_length")


def tiny_model(family: str, path: str):
    import transformers

    from packsim.reference.flash_emulation import emulate_flash

    cls, extra = FAMILIES[family]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = getattr(transformers, cls)(**_TINY, **extra, use_cache=False)
        impl = emulate_flash().name if path == "flash" else path
        return transformers.AutoModelForCausalLM.from_config(config, attn_implementation=impl).eval()


def examples(rng: random.Random) -> list[tuple[list[int], int]]:
    """2-6 examples: ([BOS] prompt response EOS, prompt length incl. BOS)."""
    out = []
    for _ in range(rng.randint(2, 6)):
        prompt = [rng.randrange(3, VOCAB) for _ in range(rng.randint(2, 8))]
        response = [rng.randrange(3, VOCAB) for _ in range(rng.randint(2, 8))]
        out.append(([BOS, *prompt, *response, EOS], 1 + len(prompt)))
    return out


def expected_labels(exs) -> list[int]:
    """What the loss should count: response tokens and EOS; prompt and each example's first label -100."""
    return [t if k >= n_prompt else -100 for ids, n_prompt in exs for k, t in enumerate(ids)]


def batch_with_fault(exs, fault: str) -> dict:
    """One flattened row (1, T) with position_ids, cu_seq_lens_q/k and max_length_q/k, and the fault."""
    lengths = [len(ids) for ids, _ in exs]
    ids = [t for x, _ in exs for t in x]
    labels = expected_labels(exs)
    pos = [p for n in lengths for p in range(n)]
    starts = [sum(lengths[:k]) for k in range(len(lengths))]
    cu = [0, *[sum(lengths[:k + 1]) for k in range(len(lengths))]]
    longest = max(lengths)
    if fault == "continuous_positions":
        pos, cu = list(range(len(ids))), [0, len(ids)]
        longest = len(ids)
    elif fault == "late_restart":  # example 1's positions restart one token late (and its offset with them)
        s = starts[1]
        pos[s:s + lengths[1]] = [pos[s - 1] + 1, *range(lengths[1] - 1)]
        cu[1] += 1
        longest = max(longest, lengths[0] + 1)
    elif fault == "prompt_in_loss":
        labels = [t if k > 0 else -100 for x, _ in exs for k, t in enumerate(x)]
    elif fault == "boundary_label":
        for s in starts[1:]:
            labels[s] = ids[s]
    elif fault == "eos_not_counted":
        for s, n in zip(starts, lengths, strict=True):
            labels[s + n - 1] = -100
    elif fault == "cu_seq_lens_off":  # the offsets only: max_length follows them
        cu[1] += 1
        longest = max(longest, lengths[0] + 1)
    elif fault == "stale_max_length":
        longest -= 1
    cu_t = torch.tensor(cu, dtype=torch.int32)
    return {"input_ids": torch.tensor([ids]), "labels": torch.tensor([labels]), "position_ids": torch.tensor([pos]),
            "cu_seq_lens_q": cu_t,
            "cu_seq_lens_k": cu_t.clone(), "max_length_q": longest, "max_length_k": longest}


def truth(model, exs, batch, rng: random.Random, tol: float = LEAK_TOL, alone_tol: float | None = None,
          **forward_kwargs) -> dict:
    """The batch's ground truth, without packsim: leak (above ``tol``), labels, fields (see the module
    docstring); ``seq_idx`` (1, T) and a 4D ``attention_mask`` (1, 1, T, T), where the batch carries
    them, against each token's example and the block-diagonal causal mask built from it.

    ``alone_tol``: position_ids are judged by what they do, not by their values: each example's
    packed logits against the example run alone (input_ids only), bad above ``alone_tol`` (a model
    that reads positions only relatively, or not at all, computes the same with positions that do
    not restart)."""
    lengths = [len(ids) for ids, _ in exs]
    owner = torch.tensor([k for k, n in enumerate(lengths) for _ in range(n)])  # (T,)
    labels_ok = batch["labels"][0].tolist() == expected_labels(exs)
    cu = [0, *[sum(lengths[:k + 1]) for k in range(len(lengths))]]
    restarts = [p for n in lengths for p in range(n)]
    positions_ok = batch["position_ids"][0].tolist() == restarts
    fields_ok = positions_ok if alone_tol is None else True  # each field the batch carries, against the examples
    for side in ("q", "k"):
        if f"cu_seq_lens_{side}" in batch:
            fields_ok &= batch[f"cu_seq_lens_{side}"].tolist() == cu
        if f"max_length_{side}" in batch:
            fields_ok &= int(batch[f"max_length_{side}"]) >= max(lengths)
    if "seq_idx" in batch:
        fields_ok &= batch["seq_idx"][0].tolist() == owner.tolist()
    mask = batch.get("attention_mask")
    if mask is not None and mask.dim() == 4:
        keep = (owner[:, None] == owner[None, :]) & torch.ones(len(owner), len(owner), dtype=torch.bool).tril()
        fields_ok &= torch.equal(mask[0, 0] == 0, keep)
    leak, gap, error = 0.0, 0.0, None
    fields = {k: v for k, v in batch.items() if k != "labels"}
    try:
        with torch.no_grad():
            base = model(**fields, **forward_kwargs).logits[0]  # (T, V)
            if alone_tol is not None:
                for k in range(len(exs)):
                    alone = model(input_ids=batch["input_ids"][:, owner == k], **forward_kwargs).logits[0]  # (L, V)
                    gap = max(gap, float((base[owner == k] - alone).abs().max()))
            for k in range(len(exs)):
                ids = batch["input_ids"].clone()
                mine = (owner == k).nonzero()[1:, 0]  # the example's tokens after its BOS
                ids[0, mine] = torch.tensor([rng.randrange(3, VOCAB) for _ in mine])
                out = model(**{**fields, "input_ids": ids}, **forward_kwargs).logits[0]
                leak = max(leak, float((out - base)[owner != k].abs().max()))
    except Exception as err:  # noqa: BLE001 - the forward itself refuses the batch (the reference kernel)
        error = f"{type(err).__name__}: {str(err)[:80]}"
    out = {"leak": leak, "labels_ok": labels_ok, "fields_ok": fields_ok, "forward_error": error,
           "bad": leak > tol or not labels_ok or not fields_ok}
    if alone_tol is not None:
        out.update(alone_gap=gap, positions_restart=positions_ok, bad=out["bad"] or gap > alone_tol)
    return out


def one_audit(seed: int, family: str, path: str, fault: str, evidence: str, models: dict) -> dict:
    import packsim

    rng = random.Random(seed)
    if (family, path) not in models:
        model = tiny_model(family, path)
        models[family, path] = model, float64_copy(model)  # audited in fp32, the truth in float64
    model, model64 = models[family, path]
    exs = examples(rng)
    batch = batch_with_fault(exs, fault)
    if path != "flash" and fault not in ("cu_seq_lens_off", "stale_max_length"):  # sdpa / eager: position_ids only
        batch = {k: v for k, v in batch.items() if not k.startswith(("cu_seq_lens", "max_length"))}
    gt = truth(model64, exs, batch, rng)
    response = torch.tensor([[k >= n for ids, n in exs for k in range(len(ids))]])  # (1, T)
    start = time.perf_counter()
    given = [ids for ids, _ in exs] if evidence == "examples" else None
    report = packsim.audit(model, batch, response_mask=response, examples=given)
    return {"seed": seed, "family": family, "path": path, "fault": fault, "evidence": evidence, "examples": len(exs),
            "status": report.status, "failed": report.failed, "check": check(report.status, gt["bad"]),
            "seconds": time.perf_counter() - start, **gt}


def check(status: str, bad: bool) -> str:
    """The audit's status against the ground truth: agrees, false PASS / FAIL, or the non-verdict itself."""
    if status in ("not measured", "unverified"):
        return status
    return "agrees" if (status == "fail") == bad else "false PASS" if status == "pass" else "false FAIL"


def cells(args) -> list[tuple[int, str, str, str, str]]:
    return seeded([(f, p, x, e) for f in args.families for p in args.paths for x in args.faults for e in EVIDENCE],
                  args)


def seeded(grid: list[tuple], args) -> list[tuple]:
    """(seed, *cell) for every cell x ``--seeds`` (``--quick``: ``--cells`` random cells), or ``--only``'s."""
    if args.quick:
        grid = random.Random(args.seed).sample(grid, min(args.cells, len(grid)))
    out, seed = [], args.seed
    for _ in range(args.seeds):
        for cell in grid:
            out.append((seed, *cell))
            seed += 1
    return out if args.only is None else [c for c in out if c[0] == args.only]


def table(rows: list[dict], key: str, tol: float = LEAK_TOL) -> str:
    """Counts per ``key``: audits, bad by the ground truth (leaking by it: above ``tol``), and each check."""
    groups: dict[str, Counter] = {}
    for r in rows:
        c = groups.setdefault(r[key], Counter())
        c[r["check"]] += 1
        c["bad"] += r["bad"]
        c["leaks"] += r["leak"] > tol
    cols = ("agrees", "false PASS", "false FAIL", "not measured", "unverified")
    return bu.markdown_table([key, "audits", "bad (truth)", "leaks (truth)", *cols],
                             [[g, sum(c[k] for k in cols), c["bad"], c["leaks"], *(c[k] for k in cols)]
                              for g, c in groups.items()])


def run_arguments(ap: argparse.ArgumentParser, argv, out_name: str, seeds: int, cells: int) -> argparse.Namespace:
    """The options every random-audit sweep takes (seeds, --only, --quick, --out), parsed; one torch thread."""
    ap.add_argument("--seeds", type=int, default=seeds, help="seeds per cell")
    ap.add_argument("--seed", type=int, default=0, help="the first seed")
    ap.add_argument("--only", type=int, help="rerun the one audit with this seed")
    ap.add_argument("--quick", action="store_true", help="--cells random cells of the grid, one seed")
    ap.add_argument("--cells", type=int, default=cells)
    ap.add_argument("--out", help=f"folder for {out_name} (default: benchmarks/results, quick: runs/)")
    args = ap.parse_args(argv)
    if args.quick:
        args.seeds = 1
    torch.set_num_threads(1)
    return args


def float64_copy(model):
    """A float64 copy of the audited fp32 model, for the truth (an MoE family's experts run eagerly:
    torch's grouped matmul takes no float64)."""
    model64 = copy.deepcopy(model).double()
    if hasattr(model64, "set_experts_implementation") and getattr(model64, "_can_set_experts_implementation",
                                                                  lambda: False)():
        model64.set_experts_implementation("eager")
    return model64


def margin(rows: list[dict], tol: float) -> str:
    """The truth's margin: the largest change of an isolated row and the smallest leak, against ``tol``."""
    isolated = [r["leak"] for r in rows if r["leak"] <= tol and not r["forward_error"]]
    leaking = [r["leak"] for r in rows if r["leak"] > tol]
    return (f"the truth's margin: largest change of an isolated row {max(isolated, default=0):.1e}, smallest leak "
            f"{min(leaking, default=float('nan')):.1e} (LEAK_TOL {tol:.0e})")


def summary(rows: list[dict], seconds: float, path) -> str:
    """The sweep's first line: how many audits agree with their ground truth, and how the others went."""
    count = Counter(r["check"] for r in rows)
    return (f"{len(rows)} audits in {seconds:.0f} s: {count['agrees']} agree with their ground truth, "
            f"{count['false PASS']} false PASS, {count['false FAIL']} false FAIL, "
            f"{count['not measured'] + count['unverified']} without a verdict ({path})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    ap.add_argument("--paths", nargs="+", default=list(PATHS), choices=list(PATHS))
    ap.add_argument("--faults", nargs="+", default=list(FAULTS), choices=list(FAULTS))
    args = run_arguments(ap, argv, "random_audits.json", seeds=2, cells=24)
    start, models = time.perf_counter(), {}
    rows = [one_audit(*c, models) for c in cells(args)]
    seconds = time.perf_counter() - start
    wrong = [r for r in rows if r["check"] in ("false PASS", "false FAIL")]
    path = bu.save_json(bu.out_dir(args.out, args.quick) / "random_audits.json",
                        {"machine": bu.machine_info(1), "seconds": seconds, "leak_tol": LEAK_TOL, "rows": rows})
    print(summary(rows, seconds, path))
    print(margin(rows, LEAK_TOL))
    for r in wrong:
        print(f"  seed {r['seed']}: {r['family']} / {r['path']} / {r['fault']}: audit {r['status']} "
              f"{r['failed']}, truth leak {r['leak']:.1e} labels_ok {r['labels_ok']} fields_ok {r['fields_ok']}")
    print()
    print(table(rows, "fault"))
    print()
    print(table(rows, "path"))
    print()
    print(table(rows, "family"))
    print()
    print(table(rows, "evidence"))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
