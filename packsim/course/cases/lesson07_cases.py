"""The batches, models and reports lesson 07's checks run on (the checks: ``lesson07_detect_contamination``).

- :func:`probe_batch`: a small packed batch (rows of 48 tokens) under a setup;
- :func:`mystery_reports`: five audit reports, each of a pipeline with at most one fault;
- :func:`collator_case`: a tiny Llama and a padding-free collator batch with an all-ones
  ``attention_mask`` added, as a generic pipeline hands it over;
- :func:`packsim_case`, :func:`pipeline_call_case`: ``(call, input_ids, seq_ids)`` for the
  perturbation probe, ``call(ids (B, T)) -> logits (B, T, V)``;
- :func:`read_by`: the structure a causal pack must show, ``{j: examples packed after j in its rows}``.

No check lives here, so no solution mirrors this module.

Lessons: A6.
"""

from __future__ import annotations

import dataclasses

import torch

from packsim.auditing import audit, response_mask_from_features
from packsim.core.batch import PackedBatch
from packsim.core.collator import PackingCollator
from packsim.core.data import make_examples
from packsim.core.model import build_model, forward
from packsim.core.segments import seq_ids_from_cu_seqlens

__all__ = ["collator_case", "mystery_reports", "packsim_case", "pipeline_call_case", "probe_batch", "read_by"]


def probe_batch(setup: str = "buggy", n: int = 5, seed: int = 4) -> PackedBatch:
    """A small packed batch of packsim examples (rows of 48 tokens) under ``setup``."""
    return PackedBatch.from_examples(make_examples(n, seed=seed), capacity=48, setup=setup)


def mystery_reports() -> dict:
    """Five audit reports ``{"A": AuditReport, ...}``, each of a pipeline with at most one fault.

    All audit the same five packsim examples through a tiny Llama (eager attention) or packsim's
    forward; which fault is behind which letter is for the learner to read from the reports.
    """
    examples = make_examples(5, seed=2)
    model = build_model("tiny", attn_implementation="eager", seed=0)
    collated = PackingCollator(return_flash_attn_kwargs=True)(examples)
    mask = response_mask_from_features(examples)  # (1, N)
    with_ones = {**collated, "attention_mask": torch.ones_like(collated["input_ids"])}
    packed = {s: PackedBatch.from_examples(examples, capacity=64, setup=s) for s in ("mask_fix", "loss_fix")}
    return {
        "A": audit(model, collated, mask, use_cache=True),
        "B": audit(model, packed["mask_fix"]),
        "C": audit(model, with_ones, mask, use_cache=False),
        "D": audit(model, packed["loss_fix"]),
        "E": audit(model, collated, mask, use_cache=False),
    }


def collator_case(impl: str):
    """A tiny Llama (``impl`` attention, config use_cache=True) and a padding-free collator batch of
    five examples with an all-ones (1, N) attention_mask added, and its (1, N) response mask."""
    examples = make_examples(5, seed=7)
    model = build_model("tiny", attn_implementation=impl, seed=0)
    model.config.use_cache = True  # LlamaConfig's default for a model built by hand
    batch = PackingCollator(return_flash_attn_kwargs=True)(examples)
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])  # what a generic pipeline adds
    mask = response_mask_from_features(examples)  # (1, N)
    return model, batch, mask


def read_by(seq_ids: torch.Tensor) -> dict[int, list[int]]:
    """Under a causal mask over the pack: {j: examples with a token after j's last one, in its rows}."""
    out = {}
    for j in sorted(set(seq_ids[seq_ids >= 0].tolist())):
        later = set()
        for row in seq_ids:  # (T,)
            at = (row == j).nonzero()
            if len(at):
                later |= set(row[int(at.max()) + 1:].tolist())
        out[j] = sorted(later - {-1, j})
    return out


def packsim_case(setup: str):
    """``(call, input_ids (B, T), seq_ids (B, T))``: packsim's forward of :func:`probe_batch` under ``setup``."""
    model = build_model("tiny", seed=0)
    batch = probe_batch(setup, seed=4)

    def call(ids):  # packsim's forward under the batch's own setup
        return forward(model, dataclasses.replace(batch, input_ids=ids))

    return call, batch.input_ids, batch.seq_ids


def pipeline_call_case(training_call: bool):
    """A tiny Llama (sdpa) on a padding-free batch, called as a generic pipeline did (an all-ones
    attention_mask added) or corrected (no mask); use_cache=False in both, so the mask is the one difference."""
    model, batch, _ = collator_case("sdpa")
    ids = batch["input_ids"]  # (1, N)
    seq_ids = seq_ids_from_cu_seqlens(batch["cu_seq_lens_q"], ids.shape[1])[None]  # (1, N)
    extra = {"attention_mask": batch["attention_mask"]} if training_call else {}

    def call(new_ids):
        with torch.no_grad():
            return model(input_ids=new_ids, position_ids=batch["position_ids"], use_cache=False, **extra).logits

    return call, ids, seq_ids
