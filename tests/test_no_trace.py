"""The audit leaves no trace: after ``packsim.audit`` / ``audit_logprobs`` / ``audit_trainer`` the run
trains bit-identically to the same run without the audit.

Ground truth: the same training (a tiny Llama with attention dropout > 0, one decoder layer left in
eval mode), the same seed, run without the audit. Each test also checks every module's own
``training`` flag, that no hook is left behind, and that torch's, NumPy's and Python's generators
are where they were. A negative control runs the unwrapped entry point (``__wrapped__``) and sees
the RNG advanced, so the comparison can catch a trace.
"""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch
from pipelines import PAIRS, one_thread, save_tiny_checkpoint  # noqa: F401

import packsim
from packsim.auditing.no_trace import no_trace
from packsim.core.batch import PackedBatch
from packsim.core.data import make_examples
from packsim.core.model import build_model

STEPS = 3
DROPOUT = 0.2
HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def dropout_model() -> torch.nn.Module:
    """A tiny sdpa Llama whose attention drops out in train mode, its first decoder layer in eval."""
    model = build_model("tiny", attn_implementation="sdpa", seed=0)
    model.config.attention_dropout = DROPOUT
    for m in model.modules():
        if hasattr(m, "attention_dropout"):
            m.attention_dropout = DROPOUT
    model.train()
    model.model.layers[0].eval()
    return model


def flat_batch() -> dict:
    return PackedBatch.from_examples(make_examples(4, seed=0), capacity=64).to_flattening()


def train_steps(model, batch) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    fields = {k: batch[k] for k in ("input_ids", "labels", "position_ids")}
    for _ in range(STEPS):
        optimizer.zero_grad()
        model(**fields, use_cache=False).loss.backward()
        optimizer.step()


def states() -> tuple:
    return torch.get_rng_state(), np.random.get_state(), random.getstate()


def same_states(a, b) -> bool:
    (ta, na, pa), (tb, nb, pb) = a, b
    return torch.equal(ta, tb) and pa == pb and na[0] == nb[0] and np.array_equal(na[1], nb[1]) and na[2:] == nb[2:]


def trace(model) -> tuple:
    """Per module: its training flag and its hook ids."""
    return tuple((name, m.training, tuple(tuple(getattr(m, h, {})) for h in HOOKS))
                 for name, m in model.named_modules())


def run_audit(entry, model, batch):
    if entry == "audit_logprobs":
        return packsim.audit_logprobs(model, batch, use_cache=False)
    return packsim.audit(model, batch, use_cache=False)


def seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("entry", ["audit", "audit_logprobs"])
def test_training_after_the_audit_is_bit_identical_to_training_without_it(entry, seed):
    model, batch = dropout_model(), flat_batch()
    bare, audited = copy.deepcopy(model), copy.deepcopy(model)
    seed_all(seed)
    train_steps(bare, batch)  # the ground truth: no audit
    seed_all(seed)
    before_states, before_trace = states(), trace(audited)
    run_audit(entry, audited, batch)
    assert same_states(states(), before_states), "the audit advanced a random generator"
    assert trace(audited) == before_trace, "a training flag or a hook changed"
    assert all(p.grad is None for p in audited.parameters())
    train_steps(audited, batch)
    for (name, a), b in zip(audited.named_parameters(), bare.parameters(), strict=True):
        assert torch.equal(a, b), f"{name} differs after {STEPS} steps (max |dw| {float((a - b).abs().max()):.2e})"


def test_without_no_trace_the_audit_leaves_a_trace():
    """Negative control: the unwrapped entry point advances a generator, so the checks above can fail."""
    model, batch = dropout_model(), flat_batch()
    seed_all(0)
    before = states()
    packsim.audit.__wrapped__(model, batch, use_cache=False)
    assert not same_states(states(), before)


def test_no_trace_removes_what_was_registered_inside_and_keeps_what_was_there():
    model = dropout_model()
    kept = model.register_forward_hook(lambda *a: None)
    before_states, before_trace = states(), trace(model)
    with no_trace(model):
        model.train()
        model.register_forward_hook(lambda *a: None)
        model.model.layers[1].register_full_backward_hook(lambda *a: None)
        torch.nn.modules.module.register_module_forward_hook(lambda *a: None)
        next(model.parameters()).requires_grad_(False)
        model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
        torch.rand(3)
        model._output_capturing_hooks_installed = True  # transformers' mark of its lazy hooks goes with them
    assert trace(model) == before_trace and same_states(states(), before_states)
    assert not hasattr(model, "_output_capturing_hooks_installed")
    assert kept.id in model._forward_hooks and not torch.nn.modules.module._global_forward_hooks
    assert all(p.requires_grad and p.grad is None for p in model.parameters())


def test_no_trace_restores_on_an_exception():
    model = dropout_model()
    before_states, before_trace = states(), trace(model)
    with pytest.raises(RuntimeError), no_trace(model):
        model.eval()
        model.register_forward_pre_hook(lambda *a: None)
        torch.rand(5)
        raise RuntimeError("the audit broke")
    assert trace(model) == before_trace and same_states(states(), before_states)


# ---------------------------------------------------------------- a transformers Trainer, 3 steps


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_tiny_checkpoint(tmp_path_factory.mktemp("no-trace-llama"))


def trainer_for(path, tmp_path):
    pytest.importorskip("datasets")
    import datasets
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    from packsim import PackingCollator
    from packsim.core.tokenizer import BOS_ID, EOS_ID, encode

    features = [{"prompt_ids": [BOS_ID] + encode(p), "response_ids": encode(c) + [EOS_ID]} for p, c in PAIRS]
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=STEPS,
                             report_to="none", save_strategy="no", use_cpu=True, remove_unused_columns=False,
                             use_cache=False, seed=0, learning_rate=1e-2, disable_tqdm=True)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa", attention_dropout=DROPOUT)
    return Trainer(model=model, args=args, train_dataset=datasets.Dataset.from_list(features),
                   data_collator=PackingCollator())


def test_audit_trainer_then_train_gives_the_weights_of_train_alone(checkpoint, tmp_path):
    bare = trainer_for(checkpoint, tmp_path / "bare")
    assert bare.model.config.attention_dropout == DROPOUT
    bare.train()  # the ground truth: no audit
    audited = trainer_for(checkpoint, tmp_path / "audited")
    audited.model.model.layers[0].eval()
    before_states, before_trace = states(), trace(audited.model)
    report = packsim.audit_trainer(audited)
    assert report.status == "pass", report.table()
    assert same_states(states(), before_states) and trace(audited.model) == before_trace
    audited.train()
    assert audited.state.global_step == bare.state.global_step == STEPS
    for (name, a), b in zip(audited.model.named_parameters(), bare.model.parameters(), strict=True):
        assert torch.equal(a, b), f"{name} differs after {STEPS} steps (max |dw| {float((a - b).abs().max()):.2e})"
