"""Benchmark: what the audit costs, relative to one training step on the same batch (issue 21 item 8).

A transformers ``Trainer`` with ``DataCollatorWithFlattening`` (one padding-free row, position_ids
restarting) on a tiny Llama (hidden 128, 2 layers, sdpa, fp32, CPU) and synthetic examples of
16..64 tokens, ``--examples`` per batch (8, 32, 128). For each batch size, in one fresh process:

- ``audit_s``: wall time of ``packsim.audit_trainer(trainer)`` (one batch, its defaults);
- ``step_s``: one training step on the same batch: ``trainer.compute_loss`` forward + backward;
- ``ratio``: audit_s / step_s (medians of ``--repeats``), the number to compare;
- ``forward_tokens``: tokens through the model's forward during the audit divided by the batch's
  tokens ("forward passes' worth of tokens"; backward passes of the gradient probe not counted).

``--before DIR`` also measures the code checked out in DIR (e.g. ``git worktree add /tmp/before
f3b6a4b``: the audit that perturbs one example per forward), imported first on sys.path in its
worker, so the table shows before and after side by side on the same machine and batches.

    python benchmarks/audit_cost.py --before /tmp/before     # 8, 32, 128 examples, 3 repeats
    python benchmarks/audit_cost.py --quick                  # 8 examples, 1 repeat (CI)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import benchutil as bu

SCRIPT = Path(__file__).resolve()


def _build(spec: dict):
    """(trainer, batch): the Trainer over ``spec['examples']`` synthetic examples, and its one batch."""
    import datasets
    import torch
    import transformers
    from transformers import DataCollatorWithFlattening, LlamaConfig, Trainer, TrainingArguments

    transformers.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    gen = torch.Generator().manual_seed(0)
    n = spec["examples"]
    feats = []
    for _ in range(n):
        length = int(torch.randint(16, 65, (1,), generator=gen))
        n_prompt = length // 2
        ids = [1] + torch.randint(4, 60, (length - 2,), generator=gen).tolist() + [2]
        feats.append({"input_ids": ids, "labels": [-100] * n_prompt + ids[n_prompt:]})
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=256, bos_token_id=1,
                         eos_token_id=2, pad_token_id=0, use_cache=False)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    args = TrainingArguments(output_dir=tempfile.mkdtemp(prefix="audit_cost_"), per_device_train_batch_size=n, max_steps=1,
                             report_to="none", save_strategy="no", use_cpu=True, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(feats),
                      data_collator=DataCollatorWithFlattening())
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    return trainer, batch


def measure(spec: dict) -> dict:
    """One batch size in this process: audit and step times, forward tokens of the audit."""
    if spec.get("code"):
        sys.path.insert(0, spec["code"])  # the code under test first (before: an older checkout)
    import torch

    torch.set_num_threads(1)
    import packsim

    trainer, batch = _build(spec)
    model = trainer.model
    counted = {"tokens": 0}

    def count(_module, args, kwargs):
        x = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else kwargs.get("inputs_embeds")
        if x is None and args:
            x = args[0]
        counted["tokens"] += int(x.shape[0] * x.shape[1])

    def step():
        model.train()
        model.zero_grad(set_to_none=True)
        trainer.compute_loss(model, batch).backward()

    audits, steps, tokens, failed = [], [], [], None
    for _ in range(spec["repeats"] + 1):  # the first round warms up, untimed
        t0 = time.perf_counter()
        step()
        steps.append(time.perf_counter() - t0)
        counted["tokens"] = 0
        hook = model.register_forward_pre_hook(count, with_kwargs=True)
        t0 = time.perf_counter()
        report = packsim.audit_trainer(trainer)
        audits.append(time.perf_counter() - t0)
        hook.remove()
        tokens.append(counted["tokens"])
        failed = report.failed
    audits, steps = audits[1:], steps[1:]
    n_tokens = int(batch["input_ids"].numel())
    return {"examples": spec["examples"], "batch_tokens": n_tokens, "code": packsim.__file__,
            "audit_s": statistics.median(audits), "step_s": statistics.median(steps),
            "ratio": statistics.median(a / s for a, s in zip(audits, steps, strict=True)),
            "forward_tokens": tokens[-1] / n_tokens, "audit_failed": failed}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if bu.worker_main(argv, measure):
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=bu.int_list, default=[8, 32, 128], help="examples per batch")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--before", default=None, help="a checkout of the earlier code to measure too")
    ap.add_argument("--quick", action="store_true", help="8 examples, 1 repeat, results to runs/")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.examples, args.repeats = [8], 1
    out = args.out or (bu.QUICK_DIR if args.quick else bu.RESULTS_DIR)
    codes = {"after": str(bu.ROOT)}
    if args.before:
        codes = {"before": str(Path(args.before).resolve()), **codes}
    runs: dict[str, list[dict]] = {name: [] for name in codes}
    for n in args.examples:
        for name, code in codes.items():
            spec = {"examples": n, "repeats": args.repeats, "code": code}
            runs[name].append(bu.run_worker(SCRIPT, spec, timeout_s=1800))
    payload = {"benchmark": "audit_cost", "machine": bu.machine_info(threads=1),
               "model": "LlamaForCausalLM hidden 128, 2 layers, sdpa, fp32, CPU, 1 thread",
               "collator": "transformers.DataCollatorWithFlattening (one row, position_ids restart)",
               "examples": args.examples, "repeats": args.repeats, "codes": codes, "runs": runs}
    bu.save_json(out / "audit_cost.json", payload)
    rows = []
    for name in codes:
        for r in runs[name]:
            if "error" in r:
                rows.append((name, "-", "-", "-", "-", "-", r["error"][:60]))
                continue
            rows.append((name, r["examples"], r["batch_tokens"], f"{r['audit_s']:.3f}",
                         f"{r['step_s'] * 1e3:.1f}", f"{r['ratio']:.1f}", f"{r['forward_tokens']:.1f}"))
    print(bu.markdown_table(("code", "examples", "batch tokens", "audit s", "step ms",
                             "audit / step", "forward tokens / batch tokens"), rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
