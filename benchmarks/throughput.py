"""Benchmark 3: training throughput, packed vs padded, same real-token budget (notebooks 01, 06).

The tiny model (``packsim.core.model.build_model("tiny")``, random init) trains on the long-tailed mix
of copy examples (``packsim.core.data.make_long_tailed_examples``: lognormal lengths, median 90, sigma
0.9, clipped to [8, 2048]). Every optimizer step sees the same ``--examples-per-step`` examples
(default 256, about 35k real tokens) in both modes, each mode with its own model and AdamW
(same init):

- ``padded``: one example per row, micro-batches of ``--padded-batch`` examples, each padded to
  its own longest example (dynamic padding, as ``DataCollatorWithPadding`` does), gradients
  accumulated, loss normalised over every counted token of the step;
- ``packed``: the same examples BFD-packed into rows of ``--capacity`` tokens under the
  ``correct`` setup (block-diagonal attention through packsim's varlen path, reset positions,
  completion-only loss), in micro-batches of ``--packed-rows`` rows (default 1: 2048 tokens,
  about the size of a padded micro-batch, so both sides work on similar-sized tensors), gradients
  accumulated. Packing is per step, so the last row of each step is partly empty (a pipeline
  that packs the whole dataset at once, like TRL's ``pack_dataset``, wastes less).

A step is forward + backward (+ accumulation) + ``AdamW.step()``, timed by packsim's step timer
(``packsim.experiment.throughput.timed_step``, as appendix A1 does). Steps alternate between the
modes (same examples side by side); reported: real (non-pad) tokens per second over the timed
steps, and the per-step packed/padded ratio, median [min-max]. As a check that both modes
compute the same thing, the first (untimed) step's losses are compared: same init, same
examples, so they agree to float precision.

    python benchmarks/throughput.py            # 8 timed steps of 256 examples
    python benchmarks/throughput.py --quick    # 2 timed steps
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import benchutil as bu

MIX = "long-tailed copy examples: lognormal lengths, median 90, sigma 0.9, clipped to [8, 2048]"


def step_batches(examples: Sequence, mode: str, capacity: int, padded_batch: int,
                 packed_rows: int = 1) -> list:
    """The PackedBatches of one optimizer step: packed micro-batches of ``packed_rows`` rows
    (0: the whole step in one batch), or padded micro-batches of ``padded_batch`` examples."""
    from packsim.core.batch import PackedBatch
    from packsim.core.packing import pack

    if mode == "packed":
        if packed_rows <= 0:
            return [PackedBatch.from_examples(examples, capacity, "correct", strategy="bfd")]
        rows = pack([len(ex.tokens) for ex in examples], capacity, strategy="bfd")  # ints: no overflow
        groups = [rows[i: i + packed_rows] for i in range(0, len(rows), packed_rows)]
        return [PackedBatch.from_examples([examples[j] for row in g for j in row], capacity, "correct",
                                          strategy="bfd") for g in groups]
    if mode == "padded":
        return [PackedBatch.from_examples(examples[i: i + padded_batch], capacity, "padded")
                for i in range(0, len(examples), padded_batch)]
    raise ValueError(f"unknown mode {mode!r}: use 'packed' or 'padded'")


def make_trainer(size: str, seed: int, device=None, dtype=None, lr: float = 1e-3):
    """(model in train mode, AdamW) built the same way for every mode."""
    import torch

    from packsim.core.model import build_model

    model = build_model(size, seed=seed)
    if device is not None or dtype is not None:
        model = model.to(device=device, dtype=dtype)
    model.train()
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def run_modes(examples: Sequence, args, device=None, dtype=None, sync=None, backend="auto") -> dict:
    """Alternate padded and packed steps over the same examples; return per-mode step records.

    Each step is timed by :func:`packsim.experiment.throughput.timed_step` (its micro-batches'
    gradients accumulated, the loss over every counted target of the step).
    """
    from packsim.experiment.throughput import timed_step

    trainers = {m: make_trainer(args.model, args.seed, device, dtype) for m in ("padded", "packed")}
    per_step = args.examples_per_step
    chunks = [examples[i: i + per_step] for i in range(0, len(examples), per_step)]
    records: dict[str, list[dict]] = {"padded": [], "packed": []}
    for i, chunk in enumerate(chunks):
        order = ("padded", "packed") if i % 2 == 0 else ("packed", "padded")
        for mode in order:
            batches = [b.to(device) if device is not None else b
                       for b in step_batches(chunk, mode, args.capacity, args.padded_batch,
                                             args.packed_rows)]
            model, opt = trainers[mode]
            rec = timed_step(model, opt, batches, sync=sync, backend=backend)  # seconds, loss, tokens, rows
            rec.update(step=i, warmup=i == 0)
            records[mode].append(rec)
        p, q = records["padded"][-1], records["packed"][-1]
        print(f"step {i}{' (warmup)' if i == 0 else ''}: padded {p['real_tokens'] / p['seconds']:,.0f} "
              f"real tok/s ({p['all_tokens']} tokens), packed {q['real_tokens'] / q['seconds']:,.0f} "
              f"real tok/s ({q['all_tokens']} tokens)", flush=True)
    return records


def summarize_modes(records: dict) -> dict:
    """Tokens/s per mode over the timed steps, and the per-step packed/padded speed ratio."""
    out: dict = {}
    timed = {m: [r for r in recs if not r["warmup"]] for m, recs in records.items()}
    for m, recs in timed.items():
        secs = sum(r["seconds"] for r in recs)
        real = sum(r["real_tokens"] for r in recs)
        allt = sum(r["all_tokens"] for r in recs)
        out[m] = {
            "steps": len(recs),
            "real_tokens": real,
            "all_tokens": allt,
            "seconds": secs,
            "real_tokens_per_s": real / secs if secs else float("nan"),
            "all_tokens_per_s": allt / secs if secs else float("nan"),
            "pad_fraction": 1 - real / allt if allt else float("nan"),
            "step_real_tokens_per_s": bu.summarize([r["real_tokens"] / r["seconds"] for r in recs]),
        }
    pairs = list(zip(timed["padded"], timed["packed"], strict=True))
    for a, b in pairs:
        if a["real_tokens"] != b["real_tokens"]:
            raise RuntimeError(f"step {a['step']}: padded and packed saw different real tokens")
    # same real tokens per step, so the speed ratio is the time ratio padded / packed
    out["ratio"] = bu.summarize([a["seconds"] / b["seconds"] for a, b in pairs])
    out["ratio_overall"] = out["packed"]["real_tokens_per_s"] / out["padded"]["real_tokens_per_s"]
    # the ratio if every token (padding included) cost the same in both modes
    out["token_ratio"] = out["padded"]["all_tokens"] / out["packed"]["all_tokens"]
    w_pad, w_pack = records["padded"][0], records["packed"][0]
    out["step0_loss"] = {"padded": w_pad["loss"], "packed": w_pack["loss"],
                         "abs_diff": abs(w_pad["loss"] - w_pack["loss"])}
    return out


def token_ceilings(examples: Sequence, capacity: int, per_step: int, batch_sizes=(4, 8, 16, 32)) -> dict:
    """Tokens incl. padding, padded / packed, for several padded micro-batch sizes (no training).

    The speed-up packing would give if every token cost the same: the ceiling for the measured
    ratio at each padded batch size. Keys are the micro-batch sizes (as strings, for JSON).
    """
    from packsim.core.packing import pack

    lengths = [len(ex.tokens) for ex in examples]
    steps = [lengths[i: i + per_step] for i in range(0, len(lengths), per_step)]
    packed = sum(len(pack(s, capacity, strategy="bfd")) * capacity for s in steps)
    out = {}
    for bs in batch_sizes:
        padded = sum(len(mb) * max(mb) for s in steps for mb in (s[i: i + bs] for i in range(0, len(s), bs)))
        out[str(bs)] = padded / packed
    return out


def results_table(summary: dict) -> str:
    headers = ["mode", "timed steps", "real tokens", "tokens incl. padding", "padding",
               "real tokens/s (overall)", "real tokens/s per step", "packed / padded"]
    body = []
    for m in ("padded", "packed"):
        s = summary[m]
        body.append([
            m, s["steps"], f"{s['real_tokens']:,}", f"{s['all_tokens']:,}", f"{s['pad_fraction']:.1%}",
            f"{s['real_tokens_per_s']:,.0f}", bu.fmt_spread(s["step_real_tokens_per_s"], digits=4),
            "1" if m == "padded" else f"{bu.fmt_spread(summary['ratio'])} (overall {summary['ratio_overall']:.2f})",
        ])
    return bu.markdown_table(headers, body)


def check_targets(summary: dict) -> list[dict]:
    r = summary["ratio"]
    return [{
        "target": "packed >= 2.5x padded real tokens/s (same examples, tiny model; overall ratio)",
        "measured": (f"{summary['ratio_overall']:.2f} overall; per step {bu.fmt_spread(r)}; "
                     f"token-count ceiling {summary['token_ratio']:.2f}"),
        "ok": summary["ratio_overall"] >= 2.5,
    }]


def add_common_args(ap: argparse.ArgumentParser, steps: int) -> None:
    ap.add_argument("--model", default="tiny", help="packsim model size (default tiny)")
    ap.add_argument("--capacity", type=int, default=2048, help="packed row length (default 2048)")
    ap.add_argument("--examples-per-step", type=int, default=256)
    ap.add_argument("--padded-batch", type=int, default=8, help="examples per padded micro-batch")
    ap.add_argument("--packed-rows", type=int, default=1,
                    help="packed rows per micro-batch (default 1; 0: the whole step in one batch)")
    ap.add_argument("--steps", type=int, default=steps, help=f"timed steps (default {steps})")
    ap.add_argument("--seed", type=int, default=0)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 timed steps")
    add_common_args(ap, steps=8)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--out", help="results folder (default benchmarks/results, quick: runs/bench-quick)")
    args = ap.parse_args(argv)
    if args.quick and args.steps == 8:
        args.steps = 2
    for name in ("capacity", "examples_per_step", "padded_batch", "steps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from packsim.core.data import make_long_tailed_examples

    torch.set_num_threads(args.threads)
    before = bu.machine_info(threads=args.threads)
    examples = make_long_tailed_examples((args.steps + 1) * args.examples_per_step, seed=args.seed)
    t0 = time.perf_counter()
    records = run_modes(examples, args)
    summary = summarize_modes(records)
    summary["token_ceilings"] = token_ceilings(examples[args.examples_per_step:], args.capacity,
                                               args.examples_per_step)
    checks = check_targets(summary)
    after = bu.machine_info(threads=args.threads)
    payload = {
        "benchmark": "throughput",
        "command": " ".join(["python benchmarks/throughput.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine": after,
        "load": bu.load_note(before, after),
        "mix": MIX,
        "config": {k: getattr(args, k) for k in ("model", "capacity", "examples_per_step", "padded_batch",
                                                 "packed_rows", "steps", "seed", "threads")},
        "wall_s": time.perf_counter() - t0,
        "summary": summary,
        "steps": records,
        "targets": checks,
    }
    path = bu.save_json(bu.out_dir(args.out, args.quick) / "throughput.json", payload)
    print(f"\nwrote {path} ({payload['wall_s']:.0f} s; {payload['load']})")
    loss = summary["step0_loss"]
    print(f"step-0 loss, same init and examples: padded {loss['padded']:.6f}, packed "
          f"{loss['packed']:.6f} (|diff| {loss['abs_diff']:.1e})\n")
    ceilings = ", ".join(f"{k}: {v:.2f}" for k, v in summary["token_ceilings"].items())
    print(f"tokens incl. padding, padded / packed, by padded micro-batch size (timed steps): {ceilings}\n")
    print(results_table(summary))
    print()
    print(bu.markdown_table(["target", "measured", "verdict"],
                            [[c["target"], c["measured"], bu.verdict(c["ok"])] for c in checks]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
