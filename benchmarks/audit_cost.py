"""Benchmark: what the audit costs, relative to one training step on the same batch (issue 21 item 8).

A transformers ``Trainer`` with ``DataCollatorWithFlattening`` (one padding-free row, position_ids
restarting) on a tiny model from its config (``--family``: ``llama`` = LlamaForCausalLM, ``qwen3`` =
Qwen3ForCausalLM with q/k norms and grouped KV heads; hidden 128, 2 layers, sdpa, fp32, CPU, one
thread) and synthetic examples of 16..64 tokens, ``--examples`` per batch (8, 32, 128). For each
family and batch size, in one fresh process:

- ``audit_s``: wall time of ``packsim.audit_trainer(trainer)`` (one batch, its defaults);
- ``step_s``: one training step on the same batch: ``trainer.compute_loss`` forward + backward;
- ``ratio``: audit_s / step_s (medians of ``--repeats``), the number to compare;
- ``forward_tokens``: tokens through the model's forward during the audit divided by the batch's
  tokens ("forward passes' worth of tokens"; the alone rows count with their padding);
- ``forward_calls`` / ``backward_calls``: calls of the model's forward, and backward passes
  (``torch.autograd.grad`` / ``Tensor.backward``) during the audit;
- ``floor_s`` / ``floor_ratio``: the audit's floor, measured on the same batch: one packed forward
  that keeps its graph plus one backward to the input embeddings (the gradient probe), plus one
  padded forward of every example alone (the isolation reference), over ``step_s``. An audit that
  checks isolation against each example alone, with a gradient, cannot cost less than this; the
  probes on top (a perturbed forward, the loss and positions checks, the trainer's own
  ``compute_loss`` for the accumulation finding) are what ``ratio - floor_ratio`` measures.

``--before DIR`` also measures the code checked out in DIR (e.g. ``git worktree add /tmp/before
f3b6a4b``: the audit that perturbs one example per forward), imported first on sys.path in its
worker, so the table shows before and after side by side on the same machine and batches.

    python benchmarks/audit_cost.py --before /tmp/before     # llama + qwen3, 8, 32, 128 examples
    python benchmarks/audit_cost.py --quick                  # llama, 8 examples, 1 repeat (CI)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
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
    from transformers import DataCollatorWithFlattening, Trainer, TrainingArguments

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
    model = transformers.AutoModelForCausalLM.from_config(_config(spec.get("family", "llama")),
                                                          attn_implementation="sdpa")
    args = TrainingArguments(output_dir=tempfile.mkdtemp(prefix="audit_cost_"), per_device_train_batch_size=n, max_steps=1,
                             report_to="none", save_strategy="no", use_cpu=True, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(feats),
                      data_collator=DataCollatorWithFlattening())
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    return trainer, batch, [f["input_ids"] for f in feats]


FAMILIES = {
    "llama": "LlamaForCausalLM hidden 128, 2 layers, 4 heads",
    "qwen3": "Qwen3ForCausalLM hidden 128, 2 layers, 4 heads, 2 KV heads, head_dim 32, q/k RMSNorm",
}


def _config(family: str):
    """The tiny config of ``family`` (:data:`FAMILIES`), random weights, no download."""
    from transformers import LlamaConfig, Qwen3Config

    common = dict(vocab_size=64, hidden_size=128, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=256, bos_token_id=1, eos_token_id=2,
                  pad_token_id=0, use_cache=False)
    if family == "llama":
        return LlamaConfig(**common)
    if family == "qwen3":
        return Qwen3Config(**common, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False)
    raise ValueError(f"unknown family {family!r}: choose from {', '.join(FAMILIES)}")


def _floor(model, batch: dict, examples: list[list[int]]) -> float:
    """Seconds of the audit's floor: one packed forward kept for one backward to the embeddings,
    plus one right-padded forward (R, L) of every example alone (eval mode, no grad)."""
    import torch

    t0 = time.perf_counter()
    model.train()
    emb = model.get_input_embeddings()(batch["input_ids"]).detach().requires_grad_(True)  # (1, N, d)
    rest = {k: v for k, v in batch.items() if k not in ("input_ids", "labels")}
    logits = model(inputs_embeds=emb, **rest).logits  # (1, N, V)
    torch.autograd.grad(logits.float().logsumexp(-1).sum(), emb)
    model.eval()
    L = max(map(len, examples))
    x = torch.zeros(len(examples), L, dtype=torch.long)  # (R, L)
    mask = torch.zeros_like(x)
    for r, ids in enumerate(examples):
        x[r, :len(ids)], mask[r, :len(ids)] = torch.tensor(ids), 1
    with torch.no_grad():
        model(input_ids=x, attention_mask=mask, position_ids=torch.arange(L).expand_as(x))
    model.train()
    return time.perf_counter() - t0


def measure(spec: dict) -> dict:
    """One batch size in this process: audit and step times, forward tokens of the audit."""
    if spec.get("code"):  # the code under test first (before: an older checkout)
        # benchutil has imported this tree's packsim already (its tables): forget it, then import
        # the checkout's; a worker that still got another tree's packsim stops instead of measuring it
        for name in [m for m in sys.modules if m == "packsim" or m.startswith("packsim.")]:
            del sys.modules[name]
        sys.path.insert(0, spec["code"])
    import torch

    torch.set_num_threads(1)
    import packsim

    if spec.get("code") and not Path(packsim.__file__).resolve().is_relative_to(Path(spec["code"]).resolve()):
        raise RuntimeError(f"imported {packsim.__file__}, not the code under test in {spec['code']}")

    trainer, batch, examples = _build(spec)
    model = trainer.model
    counted = {"tokens": 0, "calls": 0, "backward": 0}

    def count(_module, args, kwargs):
        x = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else kwargs.get("inputs_embeds")
        if x is None and args:
            x = args[0]
        counted["tokens"] += int(x.shape[0] * x.shape[1])
        counted["calls"] += 1

    grad, backward = torch.autograd.grad, torch.Tensor.backward

    def counting_grad(*args, **kwargs):
        counted["backward"] += 1
        return grad(*args, **kwargs)

    def counting_backward(*args, **kwargs):
        counted["backward"] += 1
        return backward(*args, **kwargs)

    def step():
        model.train()
        model.zero_grad(set_to_none=True)
        trainer.compute_loss(model, batch).backward()

    audits, steps, floors, counts, failed = [], [], [], {}, None
    for _ in range(spec["repeats"] + 1):  # the first round warms up, untimed
        t0 = time.perf_counter()
        step()
        steps.append(time.perf_counter() - t0)
        floors.append(_floor(model, batch, examples))
        counted.update(tokens=0, calls=0, backward=0)
        hook = model.register_forward_pre_hook(count, with_kwargs=True)
        torch.autograd.grad, torch.Tensor.backward = counting_grad, counting_backward
        t0 = time.perf_counter()
        try:
            report = packsim.audit_trainer(trainer)
        finally:
            audits.append(time.perf_counter() - t0)
            torch.autograd.grad, torch.Tensor.backward = grad, backward
            hook.remove()
        counts = dict(counted)
        failed = report.failed
    audits, steps, floors = audits[1:], steps[1:], floors[1:]
    n_tokens = int(batch["input_ids"].numel())
    return {"family": spec.get("family", "llama"), "examples": spec["examples"], "batch_tokens": n_tokens,
            "code": packsim.__file__, "audit_s": statistics.median(audits), "step_s": statistics.median(steps),
            "ratio": statistics.median(a / s for a, s in zip(audits, steps, strict=True)),
            "floor_s": statistics.median(floors),
            "floor_ratio": statistics.median(f / s for f, s in zip(floors, steps, strict=True)),
            "forward_tokens": counts["tokens"] / n_tokens, "forward_calls": counts["calls"],
            "backward_calls": counts["backward"], "audit_failed": failed}


def _commit(code: str) -> str:
    """The commit a checkout is at (a worktree's too), '+' when it has uncommitted changes; '?' outside git."""
    try:
        head = subprocess.run(["git", "-C", code, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", code, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return head + ("+" if dirty else "")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if bu.worker_main(argv, measure):
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=bu.int_list, default=[8, 32, 128], help="examples per batch")
    ap.add_argument("--family", default="llama,qwen3", help=f"comma-separated, of {', '.join(FAMILIES)}")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--before", default=None, help="a checkout of the earlier code to measure too")
    ap.add_argument("--quick", action="store_true", help="8 examples, 1 repeat, results to runs/")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    families = [f.strip() for f in args.family.split(",") if f.strip()]
    if not families or any(f not in FAMILIES for f in families):
        ap.error(f"--family {args.family!r}: choose from {', '.join(FAMILIES)}")
    if args.quick:
        args.examples, args.repeats, families = [8], 1, families[:1]
    out = args.out or (bu.QUICK_DIR if args.quick else bu.RESULTS_DIR)
    codes = {"after": str(bu.ROOT)}
    if args.before:
        codes = {"before": str(Path(args.before).resolve()), **codes}
    runs: dict[str, list[dict]] = {name: [] for name in codes}
    for family in families:
        for n in args.examples:
            for name, code in codes.items():
                spec = {"family": family, "examples": n, "repeats": args.repeats, "code": code}
                runs[name].append(bu.run_worker(SCRIPT, spec, timeout_s=1800))
    payload = {"benchmark": "audit_cost", "machine": bu.machine_info(threads=1),
               "model": {f: f"{FAMILIES[f]}, sdpa, fp32, CPU, 1 thread" for f in families},
               "floor": "one packed forward kept for one backward to the input embeddings, plus one "
                        "padded forward of every example alone (floor_s, floor_ratio = floor_s / step_s)",
               "collator": "transformers.DataCollatorWithFlattening (one row, position_ids restart)",
               "examples": args.examples, "repeats": args.repeats, "codes": codes,
               "commits": {name: _commit(code) for name, code in codes.items()}, "runs": runs}
    bu.save_json(out / "audit_cost.json", payload)
    rows = []
    for k in range(len(families) * len(args.examples)):  # before and after side by side
        for name in codes:
            r = runs[name][k]
            if "error" in r:
                rows.append((name, "-", "-", "-", "-", "-", "-", "-", "-", "-", r["error"][:60]))
                continue
            rows.append((name, r["family"], r["examples"], r["batch_tokens"], f"{r['audit_s']:.3f}",
                         f"{r['step_s'] * 1e3:.1f}", f"{r['ratio']:.1f}", f"{r['floor_ratio']:.1f}",
                         f"{r['forward_tokens']:.1f}", f"{r['forward_calls']} / {r['backward_calls']}",
                         ", ".join(r["audit_failed"]) or "-"))
    print("floor: " + payload["floor"])
    print(bu.markdown_table(("code", "family", "examples", "batch tokens", "audit s", "step ms", "audit / step",
                             "floor / step", "forward tokens / batch tokens", "forwards / backwards",
                             "audit failed"), rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
