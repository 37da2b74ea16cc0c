"""audit_trainer on TRL's GRPOTrainer, built on CPU from a config (packsim's tiny Llama, its character
tokenizer, a local reward function, generation by the trainer itself): the packing finding and the
log-prob audit of its own completions, against TRL's own per-token log-probs and each completion
run alone, computed here."""

from __future__ import annotations

import copy

import pytest
import torch

trl = pytest.importorskip("trl")

from packsim.auditing.grpo import grpo_rows  # noqa: E402
from packsim.auditing.logprobs import audit_logprobs  # noqa: E402

PROMPTS = ["hello there", "hi", "how are you doing", "abc"]  # unequal lengths: the prompts get left-padded


def _reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    import datasets

    from packsim.core.model import build_model
    from packsim.core.tokenizer import build_tokenizer

    tok = copy.deepcopy(build_tokenizer())
    model = build_model("tiny", vocab_size=len(tok), attn_implementation="sdpa")
    args = trl.GRPOConfig(output_dir=str(tmp_path_factory.mktemp("grpo")), per_device_train_batch_size=4,
                          num_generations=2, max_completion_length=6, max_steps=1, report_to="none",
                          save_strategy="no", use_cpu=True, bf16=False, seed=0)
    return trl.GRPOTrainer(model=model, reward_funcs=_reward, args=args,
                           train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS}), processing_class=tok)


def _truth(trainer, rows) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) summed completion log-probs by TRL's own _get_per_token_logps_and_entropies on the rows,
    and (B,) by each row's real tokens run alone (no padding, no mask)."""
    ids, mask, comp = rows["input_ids"], rows["attention_mask"], rows["completion_mask"]
    C = int((comp.sum(0) > 0).nonzero().max()) + 1 - int((comp.sum(0) > 0).nonzero().min())
    model = trainer.model.eval()
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, C)  # (B, C)
        trl_sum = (logps * comp[:, -C:]).sum(1).double()
        alone = []
        for b in range(ids.shape[0]):
            real = mask[b].bool()
            x = ids[b, real][None]  # (1, L)
            lp = torch.log_softmax(model(input_ids=x).logits[0, :-1].double(), -1).gather(-1, x[0, 1:, None])[:, 0]
            alone.append(float((lp * comp[b, real][1:]).sum()))
    return trl_sum, torch.tensor(alone, dtype=torch.double)


def test_grpo_trainer_builds_on_cpu_and_its_completions_are_isolated(trainer):
    import packsim

    assert not hasattr(trainer.args, "padding_free") and not hasattr(trainer.args, "packing")
    rows = grpo_rows(trainer)
    assert bool((rows["attention_mask"][:, 0] == 0).any())  # left padding really happens
    trl_sum, alone = _truth(trainer, rows)
    assert torch.allclose(trl_sum, alone, atol=1e-4)  # ground truth: TRL's padded rows are isolated
    result = packsim.audit_trainer(trainer)
    finding = result.findings[0]
    assert finding.name == "packing" and finding.status == "pass" and "padded, not packed" in finding.evidence
    assert result.ok and result.logprobs.status == "isolated" and len(result.logprobs.sequences) == 4
    assert result.logprobs.sequences[3].name == "group 1 completion 1"
    assert torch.allclose(torch.tensor([s.alone for s in result.logprobs.sequences], dtype=torch.double), alone,
                          atol=1e-4)


def test_the_audit_sees_a_leak_in_the_same_rows(trainer):
    """Negative control: the trainer's rows with an all-ones mask (the padding visible) leak, here and in the audit."""
    rows = grpo_rows(trainer)
    ones = {**rows, "attention_mask": torch.ones_like(rows["attention_mask"])}
    model = trainer.model.eval()
    with torch.no_grad():  # independent: the padded row under an all-ones mask vs the real tokens alone
        b = int((rows["attention_mask"][:, 0] == 0).nonzero()[0])
        real = rows["attention_mask"][b].bool()
        row = model(input_ids=ones["input_ids"][b:b + 1], attention_mask=ones["attention_mask"][b:b + 1]).logits[0, real]
        alone = model(input_ids=rows["input_ids"][b, real][None]).logits[0]
    assert float((row - alone).abs().max()) > 1e-3
    seq = torch.where(rows["attention_mask"].bool(), torch.arange(4)[:, None].expand_as(rows["input_ids"]), -1)
    report = audit_logprobs(model, ones, seq=seq, use_cache=False)
    assert report.status == "leaks"


def _grpo(tmp_path, bf16: bool, callbacks=()):
    import datasets

    from packsim.core.model import build_model
    from packsim.core.tokenizer import build_tokenizer

    tok = copy.deepcopy(build_tokenizer())
    model = build_model("tiny", vocab_size=len(tok), attn_implementation="sdpa", seed=0)
    args = trl.GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2,
                          max_completion_length=6, max_steps=1, report_to="none", save_strategy="no",
                          use_cpu=True, bf16=bf16, seed=0)
    return trl.GRPOTrainer(model=model, reward_funcs=_reward, args=args, callbacks=list(callbacks),
                           train_dataset=datasets.Dataset.from_dict({"prompt": PROMPTS}), processing_class=tok)


def test_a_bf16_grpo_run_is_audited_in_bf16_and_trains_with_the_callback_as_without_it(tmp_path):
    """GRPOConfig(bf16=True): the log-prob check runs under the trainer's autocast and its tolerance follows
    bf16, so the padded (isolated, by _truth here) rows are not called leaking; with AuditCallback the run's
    weights after its step are those of the same run without it (generation, RNG and all)."""
    import packsim

    trainer = _grpo(tmp_path / "audit", bf16=True)
    rows = grpo_rows(trainer)
    ids, mask = rows["input_ids"], rows["attention_mask"]
    with torch.no_grad():  # ground truth, fp32 outside autocast: each padded row's real tokens vs them alone
        padded = trainer.model.eval()(input_ids=ids, attention_mask=mask).logits  # (B, T, V)
        for b in range(ids.shape[0]):
            alone = trainer.model(input_ids=ids[b, mask[b].bool()][None]).logits[0]
            assert float((padded[b, mask[b].bool()] - alone).abs().max()) < 1e-4  # isolated
    result = packsim.audit_trainer(trainer)
    assert result.ok and result.logprobs.status == "isolated", result.table()
    reference = _grpo(tmp_path / "a", bf16=True)
    reference.train()
    callback = packsim.AuditCallback()
    audited = _grpo(tmp_path / "b", bf16=True, callbacks=[callback])
    audited.train()
    assert callback.report is not None and callback.report.ok
    for (name, a), b in zip(reference.model.named_parameters(), audited.model.parameters(), strict=True):
        assert torch.equal(a, b), name
