"""packsim.auditing.trainer_cp: audit_trainer on a Trainer configured for accelerate's context parallelism.

accelerate builds a context-parallel Accelerator only on GPUs (packsim.core.upstream.accelerate_cp), so
these CPU tests give a CPU Trainer the parallelism config such a run has (``cp_size=2``, torch backend)
and restore it after. The ground truth is computed here, apart from the audit: accelerate's own hook
function attached to a copy of the model, one example's tokens changed, the next example's logits
compared.
"""

from __future__ import annotations

import copy
import tempfile

import pytest
import torch
import transformers
from accelerate.big_modeling import _attach_context_parallel_hooks
from accelerate.parallelism_config import ParallelismConfig

import packsim
from packsim.auditing.trainer_cp import CP_FIX
from packsim.core.collator import PackingCollator

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _trainer(setup: str, batch: int = 4):
    model = packsim.build_model("tiny", seed=0, attn_implementation="sdpa")
    args = transformers.TrainingArguments(tempfile.mkdtemp(), per_device_train_batch_size=batch, report_to=[],
                                          remove_unused_columns=False, use_cpu=True)
    data = [{"prompt_ids": e.prompt, "response_ids": e.response} for e in packsim.make_examples(8, seed=1)]
    return transformers.Trainer(model=model, args=args, train_dataset=data, data_collator=PackingCollator(setup))


@pytest.fixture
def context_parallel(monkeypatch):
    """The trainer's accelerator reads the parallelism config of a 2-rank torch context-parallel run.

    ``Accelerator.prepare`` then calls ``_prepare_cp``, which hands a dataloader back unchanged after
    binding ``context_parallel`` to the device mesh's ``cp`` dimension (there is no mesh on one CPU
    process): here it hands the dataloader back, as it does on the GPUs."""
    def configure(trainer):
        monkeypatch.setattr(trainer.accelerator.state, "parallelism_config", ParallelismConfig(cp_size=2))
        monkeypatch.setattr(trainer.accelerator, "_prepare_cp", lambda *args: args)
        return trainer
    return configure


def _next_example_change(model, batch) -> float:
    """Ground truth: max |change| of example 1's logits when example 0's tokens change (one packed row)."""
    ids, pos = batch["input_ids"][:1], batch["position_ids"][:1]  # (1, T)
    starts = (pos[0] == 0).nonzero().flatten().tolist() + [ids.shape[1]]
    moved = ids.clone()
    moved[0, starts[0]:starts[1]] = (moved[0, starts[0]:starts[1]] + 1) % model.config.vocab_size
    with torch.no_grad():
        a = model(input_ids=ids, position_ids=pos).logits[0, starts[1]:starts[2]]
        b = model(input_ids=moved, position_ids=pos).logits[0, starts[1]:starts[2]]
    return float((a - b).abs().max())


def test_the_ground_truth_accelerates_hooks_make_a_packed_row_leak():
    trainer = _trainer("correct")
    batch = next(iter(trainer.get_train_dataloader()))
    model = copy.deepcopy(trainer.model).eval()
    assert _next_example_change(model, batch) < 1e-5  # the packed mask from position_ids keeps them apart
    _attach_context_parallel_hooks(model)
    assert _next_example_change(model, batch) > 1e-3  # mask dropped, is_causal=True: example 1 sees example 0


def test_a_packed_context_parallel_trainer_fails_with_the_context_parallel_finding(context_parallel):
    plain = packsim.audit_trainer(_trainer("correct"))
    assert plain.ok and "context_parallel" not in {f.name for f in plain.findings}  # no CP: no finding
    trainer = context_parallel(_trainer("correct"))
    report = packsim.audit_trainer(trainer)
    finding = next(f for f in report.findings if f.name == "context_parallel")
    assert not report.ok and finding.failed and "cp_size 2" in finding.evidence and finding.fix == CP_FIX
    assert report.probes["perturbation"].failed
    assert report.causes[0].startswith("context_parallel: ") and "context parallelism" in report.causes[0]


def test_one_example_per_row_passes_under_context_parallelism(context_parallel):
    trainer = context_parallel(_trainer("correct", batch=1))  # the collator's row holds the one example
    batch = next(iter(trainer.get_train_dataloader()))
    assert int((batch["position_ids"] == 0).sum(1).max()) == 1  # truth: one example per row
    report = packsim.audit_trainer(trainer)
    finding = next(f for f in report.findings if f.name == "context_parallel")
    assert finding.status == "pass", finding.evidence
    assert not report.probes["perturbation"].failed


def test_the_audit_removes_the_hooks_it_attached(context_parallel):
    trainer = context_parallel(_trainer("correct"))
    mine = trainer.model.model.layers[0].self_attn.register_forward_pre_hook(lambda m, a: None)
    before = {n: list(m._forward_pre_hooks) for n, m in trainer.model.named_modules()}
    packsim.audit_trainer(trainer)
    assert {n: list(m._forward_pre_hooks) for n, m in trainer.model.named_modules()} == before
    mine.remove()


def test_padding_before_an_example_fails_under_context_parallelism():
    """Ground truth: with accelerate's hooks a left-padded row's tokens attend the padding before them."""
    from packsim.auditing.report import AuditReport
    from packsim.auditing.trainer_cp import cp_finding

    model = packsim.build_model("tiny", seed=0, attn_implementation="sdpa").eval()
    ids = torch.tensor([[0, 0, 0, 5, 6, 7, 8]])  # (1, 7): three pads (id 0) before the example
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1]])
    pos = torch.tensor([[0, 0, 0, 0, 1, 2, 3]])
    other = ids.clone()
    other[0, :3] = 9  # only the padding changes

    def change() -> float:
        with torch.no_grad():
            return float((model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[0, 3:]
                          - model(input_ids=other, attention_mask=mask, position_ids=pos).logits[0, 3:]).abs().max())

    assert change() < 1e-5  # the padding mask honoured
    _attach_context_parallel_hooks(model)
    assert change() > 1e-3
    seq = torch.tensor([[-1, -1, -1, 0, 0, 0, 0]])
    report = AuditReport(probes={}, boundaries="", example_ids=[0], forward="", logit_change=None,
                         gradient_ratio=None, attention_outside=None, worst_pair=None, causes=[], seconds=0.0)
    step = {"cp_size": 2, "hooked": ["model.layers.0.self_attn"], "refused": None}
    finding = cp_finding(step, report, seq)
    assert finding.failed and "padding before an example" in finding.evidence
    assert cp_finding(step, report, torch.tensor([[0, 0, 0, 0, -1, -1, -1]])).status == "pass"  # right padding
    assert cp_finding({**step, "cp_size": 1}, report, seq) is None
