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


def make_dpo(padding_free=True):
    tok = copy.deepcopy(build_tokenizer())
    model = build_model("tiny", vocab_size=len(tok), attn_implementation="sdpa")
    data = datasets.Dataset.from_dict({"prompt": ["hello there", "how are you"],
                                       "chosen": [" fine thanks", " good"], "rejected": [" no", " bad day"]})
    args = trl.DPOConfig(output_dir=tempfile.mkdtemp(), padding_free=padding_free, per_device_train_batch_size=2,
                         max_steps=1, report_to="none", save_strategy="no", use_cpu=True, bf16=False, seed=0)
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
