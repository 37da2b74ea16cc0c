"""The hybrid-state finding: packsim.audit fails a packed batch on a Mamba2 hybrid that the CPU path
cannot isolate, naming the layer type; a model without stateful layers gets no such finding."""

import importlib.util

import pytest
import torch
from installed import mamba2_drops_seq_idx

from packsim import audit
from packsim.auditing.hybrid_findings import hybrid_state, stateful_layers
from packsim.exhibits.hybrid_traps import build_frontier, frontier_batch
from packsim.exhibits.trap_cases import build_family


@pytest.fixture(scope="module")
def bamba():
    return build_frontier("bamba")


def test_packed_rows_on_a_hybrid_fail_naming_the_layer(bamba):
    batch, seq = frontier_batch("positions")
    with torch.no_grad():  # ground truth here: example 1 alone vs packed
        packed = bamba(**batch, use_cache=False).logits[0, seq[0] == 1]
        alone = bamba(input_ids=batch["input_ids"][:, seq[0] == 1], use_cache=False).logits[0]
    assert float((packed - alone).abs().max()) > 1e-3  # it really leaks
    report = audit(bamba, batch, use_cache=False)
    finding = next(f for f in report.findings if f.name == "hybrid_state")
    assert finding.failed and "BambaMixer" in finding.evidence and "no seq_idx" in finding.evidence
    assert "hybrid_state" in report.failed and "perturbation" in report.failed


def test_seq_idx_without_kernels_still_fails(bamba):
    batch, _ = frontier_batch("cu_seq_lens")  # the conv fallback ignores it silently
    finding = hybrid_state(bamba, batch)
    if torch.cuda.is_available() and importlib.util.find_spec("mamba_ssm"):
        pytest.skip("kernels installed: the finding defers to the perturbation probe")
    assert finding.failed and "cu_seq_lens_q" in finding.evidence


def test_one_example_per_row_passes_and_attention_only_models_get_none(bamba):
    batch, _ = frontier_batch("positions")
    one = {"input_ids": batch["input_ids"][:, :10], "position_ids": torch.arange(10)[None]}
    assert hybrid_state(bamba, one).status == "pass"
    assert stateful_layers(build_family("llama")) == []
    assert hybrid_state(build_family("llama"), batch) is None


def test_seq_idx_refused_on_cpu_is_not_measured_naming_the_layer(bamba):
    """transformers refuses seq_idx on the torch fallback: the audit says NOT MEASURED (needs a kernel
    that reads seq_idx, BambaMixer named), never PASS, never the ValueError."""
    if torch.cuda.is_available() and importlib.util.find_spec("causal_conv1d"):
        pytest.skip("the kernels are installed: seq_idx runs, the audit measures it")
    batch, seq = frontier_batch("seq_idx")
    report = audit(bamba, batch, use_cache=False)
    if not _refused_here(bamba, batch):  # transformers 5.16.1: no refusal to report, a leak to catch
        _fails_as_a_silent_leak(bamba, batch, seq[0:1].long(), report)
        return
    assert report.status == "not measured" and not report.verdict.startswith("PASS")
    finding = next(f for f in report.findings if f.name == "hybrid_state")
    assert finding.status == "skipped"
    assert "BambaMixer" in finding.evidence and "needs a kernel that reads seq_idx (causal_conv1d / mamba_ssm / fla on CUDA, or packsim's reference kernels on any CPU)" in finding.evidence
    for name in ("perturbation", "gradient", "attention_mass"):
        assert report.probes[name].status == "skipped" and "needs a kernel that reads seq_idx" in report.probes[name].summary
    labelled = {**batch, "labels": batch["input_ids"].clone()}  # the probes that need no forward still run
    assert audit(bamba, labelled, use_cache=False).probes["loss_coverage"].status != "skipped"


def test_other_value_errors_still_raise():
    from packsim.auditing.hybrid_findings import kernel_refusal

    assert kernel_refusal(build_family("llama"), ValueError("can't keep packed sequences apart without x")) == ""
    assert kernel_refusal(build_frontier("bamba"), ValueError("something else")) == ""


def test_a_trainer_whose_collator_gives_seq_idx_is_not_measured_on_cpu(bamba, tmp_path):
    """A transformers Trainer packing with DataCollatorWithFlattening(return_seq_idx=True) on Bamba: its
    own training step cannot run here; audit_trainer says not measured (needs a kernel that reads seq_idx), no traceback."""
    if torch.cuda.is_available() and importlib.util.find_spec("causal_conv1d"):
        pytest.skip("the kernels are installed: seq_idx runs, the audit measures it")
    import datasets
    from transformers import DataCollatorWithFlattening, Trainer, TrainingArguments

    from packsim import audit_trainer

    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, 90, (n,), generator=g).tolist() for n in (7, 9, 6, 8)]
    data = datasets.Dataset.from_dict({"input_ids": rows})
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=1, report_to="none",
                             use_cpu=True, save_strategy="no")
    trainer = Trainer(model=bamba, args=args, train_dataset=data,
                      data_collator=DataCollatorWithFlattening(return_seq_idx=True))
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    assert "seq_idx" in batch
    fields = {k: v for k, v in batch.items() if k != "labels"}
    if not _refused_here(bamba, fields):  # transformers 5.16.1: the step runs, seq_idx dropped silently
        _fails_as_a_silent_leak(bamba, fields, batch["seq_idx"].long(), audit_trainer(trainer, objective="lm"))
        return
    with pytest.raises(ValueError, match="can't keep packed sequences apart"):
        trainer.compute_loss(bamba, batch)  # ground truth: the trainer's own loss cannot run here
    report = audit_trainer(trainer)
    finding = next(f for f in report.findings if f.name == "hybrid_state")
    assert finding.status == "skipped" and "BambaMixer" in finding.evidence and "needs a kernel that reads seq_idx" in finding.evidence
    assert report.status != "pass" and report.probes["perturbation"].status == "skipped"


def test_a_flattening_trainer_on_a_hybrid_names_the_state_not_custom_attention(bamba, tmp_path):
    """DataCollatorWithFlattening without seq_idx on Bamba: attention is isolated by position_ids, the Mamba2
    conv / SSM state is not. audit_trainer adds the hybrid_state finding and the cause names the state and
    the fix (seq_idx, the kernels), not "check custom attention code"."""
    from pipelines import flattening_trainer

    from packsim import audit_trainer

    trainer, rows = flattening_trainer(bamba, tmp_path)
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    assert "seq_idx" not in batch
    ids = batch["input_ids"][0]
    first = next(r for r in rows if ids[:len(r)].tolist() == r)  # ground truth: the row's second example
    second = next(r for r in rows if ids[len(first):len(first) + len(r)].tolist() == r)
    with torch.no_grad():
        packed = bamba(**{k: v for k, v in batch.items() if k != "labels"}).logits[0, len(first):len(first) + len(second)]
        alone = bamba(input_ids=torch.tensor([second])).logits[0]
    assert float((packed - alone).abs().max()) > 1e-3  # it leaks through the state
    report = audit_trainer(trainer, objective="lm")
    finding = next(f for f in report.findings if f.name == "hybrid_state")
    assert finding.failed and "BambaMixer" in finding.evidence and "conv / SSM" in finding.evidence
    assert "perturbation" in report.failed
    text = " ".join(report.causes)
    assert "check custom attention code" not in text, report.table()
    cause = next(c for c in report.causes if c.startswith("BambaMixer carry a conv / SSM state"))
    assert "no seq_idx" in cause and "DataCollatorWithFlattening(return_seq_idx=True)" in cause
    assert "causal_conv1d and mamba_ssm" in cause and "emulate_hybrid_kernels()" in cause and "on a GPU with" not in cause


def test_a_refused_forward_is_said_refused_with_how_to_get_the_probe(bamba):
    if torch.cuda.is_available() and importlib.util.find_spec("causal_conv1d"):
        pytest.skip("the kernels are installed: seq_idx runs, the audit measures it")
    batch, _ = frontier_batch("seq_idx")
    report = audit(bamba, batch, use_cache=False)
    if not _refused_here(bamba, batch):  # transformers 5.16.1: nothing refused, nothing said refused
        assert "refused" not in report.probes["perturbation"].summary and report.status == "fail"
        return
    pert = report.probes["perturbation"]
    assert "the forward refused the batch" in pert.summary and "refused" in pert.details
    text = report.table()
    assert "To get it: run the audit where the forward accepts this batch" in text
    assert "did not depend on input_ids" not in text and "did not change with input_ids" not in text


# ---- on packsim's reference kernels (emulate_hybrid_kernels): measured on CPU --------------------------

def _refused_here(model, batch) -> bool:
    """Ground truth: does the installed transformers refuse this forward (seq_idx on the torch fallback:
    5.24 on), or run it (5.16.1 drops seq_idx there silently)?"""
    try:
        with torch.no_grad():
            model(**batch, use_cache=False)
    except ValueError as err:
        assert "can't keep packed sequences apart" in str(err)
        return True
    return False


def _fails_as_a_silent_leak(model, batch, seq, report):
    """Where the fallback drops seq_idx silently: the state crosses (measured), and the audit FAILS it."""
    assert _each_example_moves(model, batch, seq) > 1e-3  # ground truth: it leaks
    assert report.status == "fail" and "perturbation" in report.failed, report.table()
    finding = next(f for f in report.findings if f.name == "hybrid_state")
    assert finding.failed and "drops seq_idx and cu_seq_lens_* there silently" in finding.evidence
    assert "emulate_hybrid_kernels" in finding.fix


class _DropsSeqIdx(torch.nn.Module):
    """Mamba2ForCausalLM.forward the transformers 5.24 way: the backbone is called without seq_idx."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config = inner, inner.config

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()

    def forward(self, input_ids=None, inputs_embeds=None, use_cache=None, **kwargs):
        from transformers.modeling_outputs import CausalLMOutput

        hidden = self.inner.backbone(input_ids=input_ids, inputs_embeds=inputs_embeds, use_cache=use_cache)[0]
        return CausalLMOutput(logits=self.inner.lm_head(hidden))


def _each_example_moves(model, batch, seq) -> float:
    """Ground truth here: max |logit change| of the other examples when one example's tokens change."""
    ids, rest = batch["input_ids"], {k: v for k, v in batch.items() if k != "input_ids"}
    gen, worst = torch.Generator().manual_seed(3), 0.0
    with torch.no_grad():
        base = model(input_ids=ids, **rest, use_cache=False).logits
        for e in seq[0].unique().tolist():
            mine = seq == e  # (1, T)
            new = ids.clone()
            new[mine] = (ids[mine] + torch.randint(1, 80, (int(mine.sum()),), generator=gen)) % 90 + 3
            worst = max(worst, float((model(input_ids=new, **rest, use_cache=False).logits - base).abs()[~mine].max()))
    return worst


def test_seq_idx_on_the_reference_kernel_passes_naming_the_kernel(bamba):
    from packsim.reference.hybrid_emulation import emulate_hybrid_kernels

    batch, seq = frontier_batch("seq_idx")
    with emulate_hybrid_kernels():
        assert _each_example_moves(bamba, batch, seq) <= 1e-6  # ground truth: isolated
        report = audit(bamba, batch, use_cache=False, trust_boundaries=True)  # the fields were built here
    assert report.status == "pass" and report.verdict.startswith("PASS"), report.table()
    finding = next(f for f in report.findings if f.name == "hybrid_state")
    assert finding.status == "pass" and "BambaMixer" in finding.evidence
    assert "seq_idx reaches the reference kernel (packsim, pure torch) (causal_conv1d_fn" in finding.evidence


def test_no_seq_idx_on_the_reference_kernel_fails_with_the_hybrid_cause(bamba):
    from packsim.reference.hybrid_emulation import emulate_hybrid_kernels

    batch, seq = frontier_batch("positions")
    with emulate_hybrid_kernels():
        assert _each_example_moves(bamba, batch, seq) > 1e-3  # ground truth: the state crosses
        report = audit(bamba, batch, use_cache=False, trust_boundaries=True)
    assert report.status == "fail" and {"perturbation", "hybrid_state"} <= set(report.failed), report.table()
    finding = next(f for f in report.findings if f.name == "hybrid_state")
    assert "no seq_idx" in finding.evidence and "emulate_hybrid_kernels()" in finding.fix
    assert any(c.startswith("BambaMixer carry a conv / SSM state") and "no seq_idx" in c for c in report.causes)


def test_outside_the_context_manager_the_audit_wires_nothing_and_says_how(bamba):
    """packsim.audit leaves the process's transformers as it is: seq_idx is still refused, NOT MEASURED,
    and the refusal tells how to measure it on CPU."""
    if torch.cuda.is_available() and importlib.util.find_spec("causal_conv1d"):
        pytest.skip("the kernels are installed: seq_idx runs, the audit measures it")
    from packsim.reference.hybrid_emulation import kernels_in_use

    before = kernels_in_use()
    batch, seq = frontier_batch("seq_idx")
    report = audit(bamba, batch, use_cache=False)
    assert kernels_in_use() == before
    if not _refused_here(bamba, batch):  # transformers 5.16.1: the fallback runs and leaks
        _fails_as_a_silent_leak(bamba, batch, seq[0:1].long(), report)
        return
    assert report.status == "not measured"
    finding = next(f for f in report.findings if f.name == "hybrid_state")
    assert "with packsim.reference.hybrid_emulation.emulate_hybrid_kernels():" in finding.fix
    assert "emulate_hybrid_kernels()" in report.probes["perturbation"].details["how_to_get"]


def test_gated_deltanet_needs_cu_seq_lens_next_to_seq_idx():
    """Qwen3-Next's gated delta rule reads cu_seq_lens_q, its conv seq_idx: with seq_idx alone the recurrent
    state crosses (the tiny model's fast decay leaks 2.5e-6, over fp32 noise 2e-7: under the audit's 1e-5,
    so the finding, not the perturbation, catches it); with both it isolates."""
    from packsim.reference.hybrid_emulation import emulate_hybrid_kernels

    qwen = build_frontier("qwen3_next")
    only, seq = frontier_batch("seq_idx")
    both, _ = frontier_batch("seq_idx_cu_seq_lens")
    with emulate_hybrid_kernels():
        assert _each_example_moves(qwen, only, seq) > 1e-6 and _each_example_moves(qwen, both, seq) <= 2e-7
        assert hybrid_state(qwen, only).failed and "no cu_seq_lens_q" in hybrid_state(qwen, only).evidence
        passed = hybrid_state(qwen, both)
        assert passed.status == "pass" and "chunk_gated_delta_rule" in passed.evidence


def test_a_trainer_whose_collator_gives_seq_idx_is_measured_on_the_reference_kernel(bamba, tmp_path):
    """DataCollatorWithFlattening(return_seq_idx=True) under emulate_hybrid_kernels(): the trainer's own loss
    runs, and audit_trainer measures (PASS), naming the kernel."""
    import datasets
    from transformers import DataCollatorWithFlattening, Trainer, TrainingArguments

    from packsim import audit_trainer
    from packsim.reference.hybrid_emulation import emulate_hybrid_kernels

    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, 90, (n,), generator=g).tolist() for n in (7, 9, 6, 8)]
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=1, report_to="none",
                             use_cpu=True, save_strategy="no")
    trainer = Trainer(model=bamba, args=args, train_dataset=datasets.Dataset.from_dict({"input_ids": rows}),
                      data_collator=DataCollatorWithFlattening(return_seq_idx=True))
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    seq = batch["seq_idx"].long()  # (1, T)
    fields = {k: v for k, v in batch.items() if k != "labels"}
    with emulate_hybrid_kernels():
        assert _each_example_moves(bamba.eval(), fields, seq) <= 1e-6  # ground truth: isolated
        report = audit_trainer(trainer, objective="lm")
    assert report.status == "pass", report.table()
    finding = next(f for f in report.findings if f.name == "hybrid_state")
    assert finding.status == "pass" and "reference kernel (packsim, pure torch)" in finding.evidence


def test_seq_idx_that_never_reaches_a_kernel_is_the_cause_on_the_reference_kernel():
    """A forward that drops seq_idx before its mixers (Mamba2ForCausalLM up to transformers 5.24,
    hybrid_sources.family_why; on 5.25 a head written the 5.24 way): on the reference kernels the batch
    with seq_idx still leaks, and the cause says seq_idx does not reach a kernel that reads it."""
    from packsim.reference.hybrid_emulation import emulate_hybrid_kernels

    mamba2 = build_frontier("mamba2")
    if not mamba2_drops_seq_idx():
        mamba2 = _DropsSeqIdx(mamba2)
    batch, seq = frontier_batch("seq_idx")
    with emulate_hybrid_kernels():
        assert _each_example_moves(mamba2, batch, seq) > 1e-3  # ground truth: the state crosses
        report = audit(mamba2, batch, use_cache=False, trust_boundaries=True)
    assert report.status == "fail" and "perturbation" in report.failed, report.table()
    cause = next(c for c in report.causes if "Mamba2Mixer carry a conv / SSM state" in c)
    assert "gives seq_idx, yet the examples leak: it does not reach a kernel that reads it" in cause
    assert "kernels_in_use(model)" in cause



def test_an_audit_walks_the_models_modules_for_stateful_layers_once(bamba, monkeypatch):
    """Issue 42: several findings ask stateful_layers in one audit; the model's modules are walked once."""
    import packsim.auditing.hybrid_findings as hf

    read = []  # every class name stateful_layers reads: one per module per walk
    pattern = hf._STATEFUL
    monkeypatch.setattr(hf, "_STATEFUL", type("Counted", (), {"search": lambda _, name: read.append(name) or
                                                            pattern.search(name)})())
    modules = len(list(bamba.modules()))
    assert stateful_layers(bamba) == stateful_layers(bamba) == ["BambaMixer"] and len(read) == 2 * modules
    read.clear()
    report = audit(bamba, frontier_batch("positions")[0], use_cache=False)
    assert "hybrid_state" in report.failed and len(read) == modules  # one walk for the whole audit
