"""A loss probe that cannot see the prompt/response split says "not measured", never PASS (issue 21).

The pipeline is a practitioner's: a transformers ``Trainer`` over a dataset of ``input_ids``,
``labels`` and ``completion_mask`` with ``DataCollatorWithFlattening``. With the Trainer's default
``remove_unused_columns=True`` the ``completion_mask`` (not an argument of the model's forward) is
dropped before the collator sees the features, so nothing the audit reads says which labels are
prompt and which response. The loss row must then be SKIPPED with "not measured", and the verdict
must not say the loss counts only responses, whichever the labels are; with
``remove_unused_columns=False`` the split reaches the audit and the verdict must match the ground
truth. Two families (tests/test_evidence.py: qwen3, eos == pad and no BOS; mistral, BOS + pad).
Ground truth computed here: which counted labels are prompt tokens, from the test's own prompt
lengths.
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

import datasets  # noqa: E402
from pipelines import one_thread  # noqa: E402, F401
from test_evidence import FAMILIES, build_model, features  # noqa: E402
from transformers import DataCollatorWithFlattening, Trainer, TrainingArguments  # noqa: E402

import packsim  # noqa: E402

IGNORE = -100
# labels: "responses" (prompt -100), "one_prompt_token" (the prompt's last token counted too, an
# off-by-one in the masking), "everything" (labels = input_ids)
LABELS = ("responses", "one_prompt_token", "everything")


def rows(family: str, labels: str) -> list[dict]:
    out = []
    for f in features(family):
        p, r = list(f["prompt_ids"]), list(f["response_ids"])
        n_masked = {"responses": len(p), "one_prompt_token": len(p) - 1, "everything": 0}[labels]
        ids = p + r
        out.append({"input_ids": ids, "labels": [IGNORE] * n_masked + ids[n_masked:],
                    "completion_mask": [0] * len(p) + [1] * len(r)})
    return out


def trainer(family: str, labels: str, remove_unused_columns: bool, tmp_path) -> Trainer:
    data = rows(family, labels)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=len(data),
                             max_steps=1, report_to="none", save_strategy="no", use_cpu=True,
                             remove_unused_columns=remove_unused_columns, seed=0)
    return Trainer(model=build_model(family), args=args, data_collator=DataCollatorWithFlattening(),
                   train_dataset=datasets.Dataset.from_list(data))


def prompt_labels_counted(t: Trainer) -> int:
    """Ground truth: counted labels on prompt tokens in the batch the loss sees (prompts from the rows).

    DataCollatorWithFlattening drops each example's first label (the loss never predicts it), so
    the prompt positions are read per example from the test's rows, in the order of the batch.
    """
    batch = next(iter(t.get_train_dataloader()))
    ids, labels = batch["input_ids"][0].tolist(), batch["labels"][0].tolist()
    by_tokens = {tuple(r["input_ids"]): r["completion_mask"] for r in t.train_dataset}
    counted, at = 0, 0
    while at < len(ids):
        key = next(k for k in by_tokens if tuple(ids[at:at + len(k)]) == k)
        mask = by_tokens[key]
        counted += sum(1 for i, m in enumerate(mask) if i and not m and labels[at + i] != IGNORE)
        at += len(key)
    return counted


@pytest.mark.parametrize("labels", LABELS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_dropped_completion_mask_makes_the_loss_row_not_measured(family, labels, tmp_path):
    t = trainer(family, labels, True, tmp_path)
    truth = prompt_labels_counted(t)  # ground truth: responses 0, one_prompt_token one per example
    assert (truth == 0) == (labels == "responses")
    assert "completion_mask" not in next(iter(t.get_train_dataloader()))
    report = packsim.audit_trainer(t)
    loss = report.probes["loss_coverage"]
    assert "the loss counts only responses" not in report.verdict, report.verdict
    if labels == "everything":  # every token inside the examples counted: any prompt is in the loss
        assert loss.status == "fail" and "every" in loss.details["problems"], report.table()
        return
    # the split never reached the audit: not measured, not PASS, not "unknown 35/105"
    assert loss.status == "skipped" and loss.summary.startswith("not measured"), report.table()
    assert "loss_coverage" in report.skipped and report.status == "pass", report.table()
    assert "the loss was not measured" in report.verdict, report.verdict
    row = next(line for line in report.table().splitlines() if line.startswith("loss_coverage"))
    assert "SKIPPED" in row and "PASS" not in row
    assert "remove_unused_columns=False" in report.table()  # how to get it


@pytest.mark.parametrize("labels", LABELS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_kept_completion_mask_measures_the_loss(family, labels, tmp_path):
    t = trainer(family, labels, False, tmp_path)
    truth = prompt_labels_counted(t)
    report = packsim.audit_trainer(t)
    loss = report.probes["loss_coverage"]
    assert loss.status == ("pass" if truth == 0 else "fail"), report.table()
    if truth:
        assert "prompt" in loss.details["problems"]
        assert loss.details["counts"]["prompt"][0] == truth, (truth, report.table())
    else:
        assert report.ok and "the loss counts only responses" in report.verdict, report.table()
