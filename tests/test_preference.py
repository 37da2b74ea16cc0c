"""DPO through every entry point: ``audit_trainer``, the ``--trainer`` gate and ``AuditCallback``.

TRL 1.16's DPOTrainer turns ``padding_free=True`` into padding (a logged warning). The ground
truth is read off the trainer's own batch in the test: one sequence per row (each row's
attention_mask is one run of ones), so nothing can leak, and nothing is packed. The audit answers
PASS with a ``padding_free`` notice (exit 0), FAIL only when asked to be strict; it never crashes.
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")  # a dev dependency: CI installs it

from packsim.auditing.trainer import audit_trainer  # noqa: E402
from packsim.cli import main  # noqa: E402

FACTORY = '''
import copy, tempfile
import datasets, trl
from packsim.core.model import build_model
from packsim.core.tokenizer import build_tokenizer


def make_dpo(padding_free=True, bf16=False, max_steps=1):
    tok = copy.deepcopy(build_tokenizer())
    model = build_model("tiny", vocab_size=len(tok), attn_implementation="sdpa")
    data = datasets.Dataset.from_dict({"prompt": ["hello there", "how are you"],
                                       "chosen": [" fine thanks", " good"], "rejected": [" no", " bad day"]})
    args = trl.DPOConfig(output_dir=tempfile.mkdtemp(), padding_free=padding_free, per_device_train_batch_size=2,
                         max_steps=max_steps, report_to="none", save_strategy="no", use_cpu=True, bf16=bf16, seed=0)
    return trl.DPOTrainer(model=model, ref_model=copy.deepcopy(model), args=args, train_dataset=data,
                          processing_class=tok)


def make_padded():
    return make_dpo(padding_free=False)
'''


@pytest.fixture(scope="module")
def factory(tmp_path_factory):
    path = tmp_path_factory.mktemp("dpo") / "train_dpo.py"
    path.write_text(FACTORY)
    import runpy

    return path, runpy.run_path(str(path))


def _one_sequence_per_row(trainer) -> bool:
    """Ground truth from the trainer's own first batch: each row's real tokens are one run."""
    batch = next(iter(trainer.get_train_dataloader()))
    mask = batch["attention_mask"].bool()  # (B, T)
    runs = (mask[:, 1:] & ~mask[:, :-1]).sum(-1) + mask[:, 0].long()  # (B,) starts of runs of ones
    return bool((runs == 1).all())


@pytest.mark.parametrize("name", ["make_dpo", "make_padded"])
def test_audit_trainer_passes_padded_dpo_rows_with_a_notice_when_padding_free_fell_back(factory, name):
    _, fns = factory
    trainer = fns[name]()
    assert _one_sequence_per_row(trainer)  # nothing can leak: the ground truth
    report = audit_trainer(trainer)
    assert (report.status, report.ok, report.failed) == ("pass", True, [])
    finding = next(f for f in report.findings if f.name == "padding_free")
    assert finding.status == ("notice" if name == "make_dpo" else "pass")
    assert report.verdict.startswith("PASS") and ("notice: padding_free" in report.verdict) == (name == "make_dpo")
    strict = audit_trainer(fns[name](), strict=True)
    assert strict.status == ("fail" if name == "make_dpo" else "pass")


def gate(*args) -> int:
    try:
        return main(["audit", *map(str, args)])
    except SystemExit as exit_info:
        return exit_info.code


def test_the_gate_on_a_dpo_factory_exits_0_with_the_notice(factory, capsys):
    path, _ = factory
    assert gate("--trainer", f"{path}:make_dpo") == 0
    out = capsys.readouterr().out
    assert "DPOTrainer" in out and "padding_free: NOTICE" in out and out.rstrip().endswith("gate PASS")
    assert "Traceback" not in out


def test_the_callback_on_a_dpo_trainer_trains_and_keeps_the_report(factory):
    _, fns = factory
    import packsim

    trainer = fns["make_dpo"]()
    callback = packsim.AuditCallback(trainer)
    trainer.add_callback(callback)
    trainer.train()
    assert callback.report.status == "pass" and trainer.state.global_step == 1


def test_a_correct_bf16_dpo_run_with_the_callback_trains_as_without_it(factory):
    """TRL's default bf16=True (on a CPU too): once train() prepares the model, its forward computes in
    bf16 and returns float32 logits; the tolerance follows the bf16, so a correct run is not stopped,
    and the audit leaves the run as it was (weights after 2 steps equal, bit for bit)."""
    _, fns = factory
    import torch

    import packsim

    reference = fns["make_dpo"](bf16=True, max_steps=2)
    assert _one_sequence_per_row(reference)  # ground truth: nothing can leak
    reference.train()
    trainer = fns["make_dpo"](bf16=True, max_steps=2)
    callback = packsim.AuditCallback(trainer)
    trainer.add_callback(callback)
    trainer.train()
    assert trainer.state.global_step == 2 and callback.report.status == "pass", callback.report.text()
    assert "logits float32 computed in bfloat16, tolerance 3e-02 per token" in callback.report.text()
    for (name, a), (_, b) in zip(reference.model.named_parameters(), trainer.model.named_parameters(), strict=True):
        assert torch.equal(a, b), name


def test_a_leaking_dpo_batch_under_the_bf16_trainer_is_caught(factory):
    """The trainer's own chosen / rejected sequences packed into one row without a block mask (no
    position_ids, no mask: one causal row), audited through the trainer's bf16 autocast. Its logits
    are scaled 8x (final norm weight; max |logit| ~3) so the leak is larger than bf16's 3e-2 per token.
    Ground truth here, float32 outside autocast: a later sequence's summed log-prob moves by more."""
    _, fns = factory
    import torch

    from packsim.auditing.preference import trainer_logprobs

    trainer = fns["make_dpo"](bf16=True)
    model = trainer.model.eval()
    with torch.no_grad():
        model.model.norm.weight.mul_(8)
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    real = batch["attention_mask"].bool()  # (B, T), right-padded rows
    ids = batch["input_ids"][real][None]  # (1, N): every sequence, one after another
    comp = batch["completion_mask"][real][None]
    seq = torch.repeat_interleave(torch.arange(real.shape[0]), real.sum(1))[None]  # (1, N)

    def summed(x, counted):  # (L,) token ids -> summed log-prob of the counted tokens (float64)
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=x[None], use_cache=False).logits[0, :-1].double(), -1)
        return float((lp.gather(-1, x[1:, None])[:, 0] * counted[1:]).sum())

    with torch.no_grad():
        row = torch.log_softmax(model(input_ids=ids, use_cache=False).logits[0, :-1].double(), -1)
    row = torch.cat([torch.zeros(1, dtype=torch.double), row.gather(-1, ids[0, 1:, None])[:, 0]])  # (N,)
    per_token = []
    for e in range(1, real.shape[0]):  # the first sequence has nothing before it
        where = seq[0] == e
        counted = comp[0, where].clone()
        counted[0] = 0  # its first token has no prefix in it
        packed = float((row[where] * counted).sum())
        per_token.append(abs(packed - summed(ids[0, where], counted)) / int(counted.sum()))
    assert max(per_token) > 3e-2 * 2  # ground truth: a leak well past bf16's tolerance
    report = trainer_logprobs(trainer, {"input_ids": ids, "completion_mask": comp}, seq=seq)
    assert report.status == "leaks" and report.computed == "bfloat16" and report.per_token == 3e-2, report.text()
