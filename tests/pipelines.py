"""Shared pieces of the real-pipeline tests (trainer audit, pre-flight CLI, forensics).

A module, not conftest: tests/browser has its own conftest. Import the fixture by name
(``from pipelines import one_thread``) and pytest uses it in that test module.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from packsim.core.model import build_model
from packsim.core.tokenizer import build_tokenizer

# prompt/completion pairs in the tiny tokenizer's alphabet
PAIRS = [("abc=", "cba"), ("hello:", "olleh"), ("x+y=", "z"), ("sort 321:", "123"),
         ("rev abcd:", "dcba"), ("k=v;", "v"), ("add 2 3:", "5"), ("up ab:", "ba")]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny matrices: one thread beats two fighting for a busy 2-core machine (measured 20x)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def save_tiny_checkpoint(path: Path) -> Path:
    """A tiny Llama (sdpa) and the local tokenizer, saved as any ``from_pretrained`` directory."""
    build_model("tiny", attn_implementation="sdpa", seed=0).save_pretrained(path)
    build_tokenizer().save_pretrained(path)
    return path


def leak_through_forward(trainer) -> float:
    """Ground truth without packsim: the largest logit change of one example when another's tokens change.

    On the trainer's first training batch, through the call its ``compute_loss`` makes (without
    labels; SFTTrainer adds use_cache=False); examples start at each BOS (the local tokenizer
    starts every example with one), in eval mode so dropout cannot move anything.
    """
    from packsim.core.tokenizer import BOS_ID

    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    ids = batch["input_ids"]
    rest = {k: v for k, v in batch.items() if k not in ("input_ids", "labels")}
    if type(trainer).__name__ == "SFTTrainer" or "SFTTrainer" in {c.__name__ for c in type(trainer).__mro__}:
        rest["use_cache"] = False
    starts = ids == BOS_ID
    starts[:, 0] = True
    seq = starts.reshape(-1).cumsum(0).reshape(ids.shape) - 1  # (B, T): example index per token
    real = batch["attention_mask"].bool() if "attention_mask" in batch else torch.ones_like(starts)
    model = trainer.model
    was_training = model.training
    model.eval()
    worst = 0.0
    with torch.no_grad():
        base = model(input_ids=ids, **rest).logits
        for k in range(int(seq.max()) + 1):
            changed = torch.where(seq == k, (ids + 5) % model.config.vocab_size, ids)
            diff = (model(input_ids=changed, **rest).logits - base).abs().amax(-1)  # (B, T)
            others = (seq != k) & real
            worst = max(worst, float(diff[others].max()) if bool(others.any()) else 0.0)
    model.train(was_training)
    return worst


def flattening_trainer(model, out, high: int = 90, **collate):
    """A transformers Trainer packing four seeded rows of 7, 9, 6, 8 random ids (3..high) with
    DataCollatorWithFlattening(**collate), one step, on CPU: the shape several audit tests build."""
    import datasets
    from transformers import DataCollatorWithFlattening, Trainer, TrainingArguments

    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, high, (n,), generator=g).tolist() for n in (7, 9, 6, 8)]
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=4, max_steps=1, report_to="none",
                             use_cpu=True, save_strategy="no")
    return Trainer(model=model, args=args, train_dataset=datasets.Dataset.from_dict({"input_ids": rows}),
                   data_collator=DataCollatorWithFlattening(**collate)), rows
