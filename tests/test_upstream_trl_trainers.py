"""packsim.core.upstream.trl_trainers: the forward TRL's SFTTrainer leaves on its model, and the
metrics its trainers log, read on the installed TRL.

Each fact is measured here on a tiny SFTTrainer (the local tokenizer's tiny Llama, CPU) and checked
against what was read from TRL 1.9.0 and 1.16.0 (``trl/trainer/sft_trainer.py``,
``sft_config.py``, ``utils.py``). A version between the two only has to agree with itself: what
:func:`chunked_loss_forward` says and what its model returns. A failure names the version and what
moved.
"""

from __future__ import annotations

import importlib.metadata

import pytest
import torch

pytest.importorskip("trl")

import datasets  # noqa: E402
import transformers  # noqa: E402
from packaging.version import Version  # noqa: E402
from pipelines import PAIRS, one_thread, save_tiny_checkpoint  # noqa: E402, F401
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

from packsim.core.upstream.trl_trainers import (  # noqa: E402
    CHUNKED_FORWARD,
    LOSS_FIELDS,
    METRICS,
    chunked_loss_forward,
    kept_metrics,
    logit_fields,
)

TRL = Version(importlib.metadata.version("trl"))
transformers.logging.set_verbosity_error()
datasets.disable_progress_bars()


def chunks_here() -> bool | None:
    """Read from the sources: 1.9.0 patches the forward (loss_type defaults to 'chunked_nll'),
    1.16.0 does not ('chunked_nll' is an alias of 'nll'); None between them (not read)."""
    if TRL.release[:2] == (1, 9):
        return True
    if TRL >= Version("1.16"):
        return False
    return None


BOUNDARY_FIELDS = ("position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "seq_idx")


def collated_boundary_fields(trainer) -> list[str]:
    """The boundary fields TRL's padding-free collator writes, measured on its first batch. Read from
    DataCollatorForLanguageModeling.torch_call: TRL 1.9.0 writes position_ids only; 1.16.0 adds
    cu_seq_lens_q/k, max_length_q/k and seq_idx."""
    batch = next(iter(trainer.get_train_dataloader()))
    marked = [k for k in BOUNDARY_FIELDS if k in batch]
    if TRL.release[:2] == (1, 9):
        assert marked == ["position_ids"], f"TRL {TRL}: {marked}"
    elif TRL >= Version("1.16"):
        assert marked == list(BOUNDARY_FIELDS), f"TRL {TRL}: {marked}"
    return marked


def trl_prompt_length(tok, prompt: str, completion: str) -> int:
    """How many leading tokens TRL's SFTTrainer marks as the prompt (completion_mask 0, labels -100) of
    prompt/completion text, from the tokenizer alone. Read from SFTTrainer._prepare_dataset's tokenize_fn:
    TRL 1.9.0 takes the length of the prompt tokenized alone, with the EOS the local tokenizer appends to it,
    so each completion's first token is -100 too; 1.16.0 takes the prefix it shares with prompt + completion
    tokenized (trl.data_utils.common_prefix_length)."""
    alone, full = tok(prompt)["input_ids"], tok(prompt + completion)["input_ids"]
    if TRL >= Version("1.16"):
        return next((i for i, (a, b) in enumerate(zip(alone, full, strict=False)) if a != b), min(len(alone), len(full)))
    return len(alone)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("trl-llama"))


def sft(path, tmp_path, packing=True, **config):
    data = datasets.Dataset.from_dict({"prompt": [p for p, _ in PAIRS], "completion": [c for _, c in PAIRS]})
    args = SFTConfig(output_dir=str(tmp_path / "out"), max_length=48, per_device_train_batch_size=4, max_steps=1,
                     report_to="none", save_strategy="no", use_cpu=True, seed=0, packing=packing, **config)
    return SFTTrainer(model=AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa"), args=args,
                      train_dataset=data, processing_class=AutoTokenizer.from_pretrained(path))


def first_batch(trainer) -> dict:
    return trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))


def own_logits(model, batch) -> torch.Tensor:
    """The model class's own forward (never TRL's patch), without labels: the logits to get."""
    fields = {k: v for k, v in batch.items() if k not in LOSS_FIELDS}
    return type(model).forward(model, **fields, use_cache=False).logits


def test_pin_the_default_loss_type_per_version(tmp_path):
    """SFTConfig.__post_init__: 1.9.0 sets 'chunked_nll' unless use_liger_kernel; 1.16.0 sets 'nll'."""
    loss_type = SFTConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none").loss_type
    if chunks_here() is not None:
        assert (loss_type == "chunked_nll") == chunks_here(), f"TRL {TRL} moved: loss_type {loss_type!r}"


def test_pin_the_forward_returns_no_logits_given_labels_where_it_chunks(checkpoint, tmp_path):
    """_patch_chunked_ce_lm_head (1.9.0): labels or shift_labels give a _ChunkedCELMHeadOutput with
    logits None; without them the model's own forward runs. 1.16.0: logits on every call."""
    trainer = sft(checkpoint, tmp_path)
    model, batch = trainer.model.eval(), first_batch(trainer)
    measured = {}
    with torch.no_grad():
        for key in LOSS_FIELDS:
            one = {k: v for k, v in batch.items() if k not in LOSS_FIELDS}
            one[key] = batch["labels"] if key == "labels" else batch["labels"][:, 1:].clone()
            if key == "shift_labels":  # pre-shifted, one per position (the CP / SP contract)
                one[key] = torch.cat([one[key], torch.full_like(one[key][:, :1], -100)], 1)
            measured[key] = model(**one, use_cache=False).logits is None
        without = model(**{k: v for k, v in batch.items() if k not in LOSS_FIELDS}, use_cache=False).logits
        assert torch.equal(without, own_logits(model, batch))  # every version: the model's own forward
    chunks = chunked_loss_forward(model)
    assert measured == dict.fromkeys(LOSS_FIELDS, chunks), f"TRL {TRL}: {measured}, chunked {chunks}"
    if chunks_here() is not None:
        assert chunks == chunks_here(), f"TRL {TRL} moved: chunked-CE forward {chunks}"
    if chunks:
        fn = type(model).forward  # the class is left alone: only the instance's forward is TRL's
        assert (fn.__module__, fn.__qualname__) != CHUNKED_FORWARD


def test_logit_fields_give_the_models_own_logits_on_every_version(checkpoint, tmp_path):
    trainer = sft(checkpoint, tmp_path)
    model, batch = trainer.model.eval(), first_batch(trainer)
    fields, note = logit_fields(model, batch)
    with torch.no_grad():
        out = model(**fields, use_cache=False).logits
        assert out is not None and torch.equal(out, own_logits(model, batch))
    assert ("labels" in fields) == (not chunked_loss_forward(model))
    assert bool(note) == chunked_loss_forward(model) and (not note or "labels left out" in note)
    assert logit_fields(model, {"input_ids": batch["input_ids"]}) == ({"input_ids": batch["input_ids"]}, "")


def test_pin_the_chunked_forward_is_found_behind_accelerates_mixed_precision(checkpoint, tmp_path):
    """train() prepares the model: under bf16, accelerate wraps model.forward twice (autocast, then
    convert_outputs_to_fp32), each keeping __wrapped__ (accelerate 1.13.0, 1.16.0)."""
    trainer = sft(checkpoint, tmp_path, bf16=True)
    before = chunked_loss_forward(trainer.model), trainer.model.forward
    model = trainer.accelerator.prepare_model(trainer.model)
    assert model.forward is not before[1] and getattr(model, "_original_forward", None) == before[1], \
        f"accelerate {importlib.metadata.version('accelerate')} moved: the forward is not wrapped"
    before = before[0]
    assert chunked_loss_forward(model) == before
    batch = first_batch(trainer)
    with torch.no_grad():
        assert (model(**batch, use_cache=False).logits is None) == before
        assert model(**logit_fields(model, batch)[0], use_cache=False).logits.dtype == torch.float32


def test_a_plain_model_is_not_chunked(checkpoint):
    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    assert not chunked_loss_forward(model) and not chunked_loss_forward(torch.nn.Linear(1, 1))
    batch = {"input_ids": torch.tensor([[1, 2]]), "labels": torch.tensor([[1, 2]])}
    assert logit_fields(model, batch) == (batch, "")


def test_pin_the_metrics_compute_loss_logs_and_kept_metrics_restores_them(checkpoint, tmp_path):
    """SFTTrainer.__init__ sets _metrics and _total_train_tokens (1.9.0, 1.16.0); compute_loss in train
    mode adds to both."""
    trainer = sft(checkpoint, tmp_path)
    trainer.model.train()
    assert all(hasattr(trainer, k) for k in METRICS), f"TRL {TRL} moved: {[k for k in METRICS if not hasattr(trainer, k)]}"
    batch = first_batch(trainer)
    with kept_metrics(trainer):
        trainer.compute_loss(trainer.model, dict(batch))
        assert trainer._total_train_tokens > 0 and trainer._metrics["train"], f"TRL {TRL} moved: nothing logged"
    assert trainer._total_train_tokens == 0 and not any(trainer._metrics["train"].values())


# ----------------------------------------------------------------------------- what the trainer tests expect


def test_pin_the_prompt_run_trl_masks_per_version(checkpoint, tmp_path):
    """trl_prompt_length agrees with the labels TRL prepares (its own dataset, unpacked); on the local
    tokenizer, which appends EOS to every encoding, TRL 1.9 masks one token more than 1.16."""
    trainer = sft(checkpoint, tmp_path, packing=False)
    tok = trainer.processing_class
    prompts = [trl_prompt_length(tok, p, c + tok.eos_token) for p, c in PAIRS]
    runs = [next(i for i, x in enumerate(row["labels"]) if x != -100) for row in trainer.train_dataset]
    assert sorted(runs) == sorted(prompts), f"TRL {TRL} moved: its prompt runs are {runs}, not {prompts}"
    bos = [len(tok(p)["input_ids"]) - 1 for p, _ in PAIRS]  # BOS + prompt, the EOS left off
    if chunks_here() is not None:  # 1.9 and 1.16 read (the same releases as the forward)
        assert prompts == [n + (0 if TRL >= Version("1.16") else 1) for n in bos], f"TRL {TRL}: {prompts}"


def test_pin_the_boundary_fields_the_padding_free_collator_writes(checkpoint, tmp_path):
    assert "position_ids" in collated_boundary_fields(sft(checkpoint, tmp_path))
