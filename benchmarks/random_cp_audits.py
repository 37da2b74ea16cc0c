"""Benchmark: random audits of Trainers configured for accelerate's context parallelism, against their ground truth.

Each audit is a transformers ``Trainer`` on a tiny model of one of :data:`FAMILIES` (sdpa: under torch
CP ``Trainer._prepare_context_parallel_inputs`` refuses any other, read in transformers 5.16.1 and 5.25.0), a batch of 1-4 random prompt/response examples collated by one of
:data:`COLLATORS` (packsim's packing collator: one packed row; one example per row padded on the
right; or on the left), with or without ``ParallelismConfig(cp_size=2)``, audited by
``packsim.audit_trainer(trainer)``. accelerate builds a context-parallel Accelerator only on GPUs, so
on this CPU the trainer's accelerator is given the parallelism config such a run has and its
``_prepare_cp`` passes the dataloader through, as ``tests/test_trainer_cp.py`` does; both are put
back after each audit. The ground truth is computed here, without packsim, on the batch the
trainer's dataloader gives: on a copy of the model with accelerate's own hook function attached
(``big_modeling._attach_context_parallel_hooks``: the mask dropped, ``is_causal=True``) when the run is
context-parallel, the largest change of any other example's logits when one example's tokens are
replaced, and of any example's logits when only the padding changes; above :data:`LEAK_TOL` (fp32)
the batch is bad. Where each example is comes from the collators written here (position restarts,
the attention mask), not from the audit.

The truth measures attention (the collators' labels are right by construction), so the verdict
checked is the audit's without its loss-normalisation finding, which is reported apart.
``Trainer._get_num_items_in_batch`` divides ``num_items_in_batch`` by ``cp_size`` (read in 5.16.1:
``// parallelism_config.non_data_parallel_size``; 5.25.0: ``/ (tp * cp * sp)``), undoing the
gather over the CP ranks that a real run makes; one CPU process makes no such gather, so under this simulation ``loss_over_accumulation``
measures half the count, which a real run would not have (not measured here: no two GPUs).

    python benchmarks/random_cp_audits.py            # 3 families x 3 collators x cp on/off x 4 sizes x 4 seeds
    python benchmarks/random_cp_audits.py --quick    # 8 random cells, one seed (CI smoke)
"""

from __future__ import annotations

import argparse
import copy
import random
import sys
import tempfile
import time
import warnings
from dataclasses import replace

import benchutil as bu
import torch
from random_audits import VOCAB, check, examples, run_arguments, seeded, summary, table, tiny_model

LEAK_TOL = 1e-4  # fp32 logits: an isolating forward moves other examples by round-off (~1e-7)
FAMILIES = ("llama", "qwen2", "mistral")
COLLATORS = ("packed", "right_padded", "left_padded")
SIZES = (1, 2, 3, 4)  # examples in the batch (per_device_train_batch_size)


def pad_collator(side: str):
    """One example per row, padded with id 0 on ``side``: input_ids, labels (-100 on the prompt and the
    padding), attention_mask, position_ids (0.. per example, 0 on padding), all (B, T)."""
    def collate(features):
        rows = [(f["prompt_ids"] + f["response_ids"], len(f["prompt_ids"])) for f in features]
        T = max(len(ids) for ids, _ in rows)
        out = {k: torch.zeros(len(rows), T, dtype=torch.long) for k in ("input_ids", "attention_mask", "position_ids")}
        out["labels"] = torch.full((len(rows), T), -100)
        for r, (ids, n_prompt) in enumerate(rows):
            span = slice(0, len(ids)) if side == "right" else slice(T - len(ids), T)
            out["input_ids"][r, span] = torch.tensor(ids)
            out["attention_mask"][r, span] = 1
            out["position_ids"][r, span] = torch.arange(len(ids))
            out["labels"][r, span] = torch.tensor([-100] * n_prompt + ids[n_prompt:])
        return out
    return collate


def build_trainer(family: str, collator: str, exs, out: str):
    import transformers

    import packsim

    collate = packsim.PackingCollator("correct") if collator == "packed" else pad_collator(collator.split("_")[0])
    args = transformers.TrainingArguments(out, per_device_train_batch_size=len(exs), report_to=[], use_cpu=True,
                                          remove_unused_columns=False, save_strategy="no", seed=0)
    data = [{"prompt_ids": ids[:n], "response_ids": ids[n:]} for ids, n in exs]
    return transformers.Trainer(model=tiny_model(family, "sdpa"), args=args, train_dataset=data, data_collator=collate)


def segments(batch: dict) -> torch.Tensor:
    """(B, T) example index of every token (-1 padding), from the fields the collators here write."""
    pos = batch["position_ids"]
    real = batch["attention_mask"].bool() if "attention_mask" in batch else torch.ones_like(pos, dtype=torch.bool)
    starts = (pos == 0) & real
    seq = torch.cumsum(starts.flatten(), 0).reshape(pos.shape) - 1  # (B, T): a running count over the batch
    return torch.where(real, seq, -1)


def truth(model, batch: dict, cp: bool, rng: random.Random) -> dict:
    """Leak (another example's logits move) and padding effect (an example's logits move with its padding)."""
    from accelerate.big_modeling import _attach_context_parallel_hooks

    model = copy.deepcopy(model).eval()
    if cp:
        _attach_context_parallel_hooks(model)  # what accelerate's prepare puts on every *self_attn
    fields = {k: v for k, v in batch.items() if k != "labels"}
    seq = segments(batch)  # (B, T)
    with torch.no_grad():
        base = model(**fields).logits  # (B, T, V)
        leak = 0.0
        for k in range(int(seq.max()) + 1):
            ids = fields["input_ids"].clone()
            mine = (seq == k).nonzero()[1:]  # the example's tokens after its first
            ids[mine[:, 0], mine[:, 1]] = torch.tensor([rng.randrange(3, VOCAB) for _ in range(len(mine))])
            out = model(**{**fields, "input_ids": ids}).logits
            other = (seq >= 0) & (seq != k)
            leak = max(leak, float((out - base)[other].abs().max()) if bool(other.any()) else 0.0)
        padding = 0.0
        if bool((seq < 0).any()):
            ids = fields["input_ids"].clone()
            ids[seq < 0] = 7
            padding = float((model(**{**fields, "input_ids": ids}).logits - base)[seq >= 0].abs().max())
    return {"leak": leak, "padding_effect": padding, "bad": max(leak, padding) > LEAK_TOL,
            "examples_per_row": max(len(set(row[row >= 0].tolist())) for row in seq)}


def one_audit(seed: int, family: str, collator: str, cp: str, size: int) -> dict:
    from accelerate.parallelism_config import ParallelismConfig

    import packsim

    rng = random.Random(seed)
    exs = []
    while len(exs) < size:
        exs += examples(rng)
    exs = exs[:size]
    with tempfile.TemporaryDirectory() as out:
        trainer = build_trainer(family, collator, exs, out)
        batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
        gt = truth(trainer.model, batch, cp == "cp2", rng)
        state, accel = trainer.accelerator.state, trainer.accelerator
        before = state.parallelism_config
        start = time.perf_counter()
        try:
            if cp == "cp2":  # the config a 2-rank CP run has; no device mesh on one CPU process
                state.parallelism_config = ParallelismConfig(cp_size=2)
                accel._prepare_cp = lambda *args: args
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                report = packsim.audit_trainer(trainer)
        finally:
            state.parallelism_config = before
            vars(accel).pop("_prepare_cp", None)
    cp_found = next((f.status for f in report.findings if f.name == "context_parallel"), None)
    rest = replace(report, findings=[f for f in report.findings if f.name != "loss_over_accumulation"])
    attention = rest.status  # the verdict without the loss check (see the module doc)
    return {"seed": seed, "family": family, "collator": collator, "cp": cp, "examples": size,
            "status": report.status, "failed": report.failed, "attention_status": attention,
            "context_parallel": cp_found, "check": check(attention, gt["bad"]),
            "seconds": time.perf_counter() - start, **gt}


def cells(args) -> list[tuple]:
    return seeded([(f, c, cp, n) for f in args.families for c in args.collators for cp in ("none", "cp2")
                   for n in args.sizes], args)


def main(argv=None) -> int:
    import transformers

    transformers.logging.set_verbosity_error()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    ap.add_argument("--collators", nargs="+", default=list(COLLATORS), choices=list(COLLATORS))
    ap.add_argument("--sizes", nargs="+", type=int, default=list(SIZES))
    args = run_arguments(ap, argv, "random_cp_audits.json", seeds=4, cells=8)
    start = time.perf_counter()
    rows = [one_audit(*c) for c in cells(args)]
    seconds = time.perf_counter() - start
    wrong = [r for r in rows if r["check"] in ("false PASS", "false FAIL")]
    path = bu.save_json(bu.out_dir(args.out, args.quick) / "random_cp_audits.json",
                        {"machine": bu.machine_info(1), "seconds": seconds, "rows": rows})
    print(summary(rows, seconds, path))
    named = [r for r in rows if r["cp"] == "cp2" and r["bad"]]
    print(f"context-parallel runs bad by the truth: {len(named)}, of which the audit's context_parallel finding "
          f"FAILs {sum(r['context_parallel'] == 'fail' for r in named)}; largest change where the truth says "
          f"isolated {max([max(r['leak'], r['padding_effect']) for r in rows if not r['bad']], default=0):.1e}")
    loss = [r for r in rows if "loss_over_accumulation" in r["failed"]]
    print(f"loss_over_accumulation FAILed {len(loss)} audits: {sum(r['cp'] == 'cp2' for r in loss)} under the "
          f"simulated cp_size=2 (the count divided by cp_size, see the module doc), {sum(r['cp'] == 'none' for r in loss)} "
          "without it")
    for r in wrong:
        print(f"  seed {r['seed']}: {r['family']} / {r['collator']} / {r['cp']} / {r['examples']} examples: audit "
              f"{r['attention_status']} {r['failed']}, truth leak {r['leak']:.1e} padding {r['padding_effect']:.1e}")
    for key in ("collator", "cp", "examples", "family"):
        print()
        print(table(rows, key, LEAK_TOL))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
