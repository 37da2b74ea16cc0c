"""The museum of real-world packing bugs: every exhibit is caught by the expected probe or check, and
its fixed pipeline passes everything (tiny Llama, fp32, CPU)."""

from __future__ import annotations

import re

import pytest
import torch

from packsim import PacksimError
from packsim.auditing.museum import (
    EXHIBITS,
    check_counted_labels,
    check_loss_normalisation,
    collate,
    examine,
    examples,
    global_token_mean,
    mean_of_means,
    museum_table,
    tiny,
)
from packsim.core.loss import IGNORE_INDEX

LINK = re.compile(r"^https://github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+$")
CHECKS = {"counted_labels", "loss_normalisation"}


def test_the_museum_holds_at_least_eight_documented_bugs():
    assert len(EXHIBITS) >= 8
    for name, ex in EXHIBITS.items():
        assert ex.name == name and ex.links and all(LINK.match(link) for link in ex.links), ex.links
        assert len(ex.story) > 200 and ex.expected and ex.evidence, name
    caught_by_audit = [e for e in EXHIBITS.values() if not e.expected & CHECKS]
    assert len(caught_by_audit) >= 8  # the audit alone catches at least eight of them


@pytest.mark.parametrize("name", list(EXHIBITS))
def test_exhibit_is_caught_and_its_fix_passes(name):
    exhibit = EXHIBITS[name]
    buggy = examine(name)
    assert set(buggy.failed) == set(exhibit.expected), buggy.text()
    assert exhibit.evidence in buggy.text(), buggy.text()
    fixed = examine(name, fixed=True)
    assert fixed.failed == [], fixed.text()
    assert fixed.report.ok and all(not f.failed for f in fixed.findings)


def test_leak_exhibits_are_real_leaks_and_fixes_are_exact():
    for name in ("all_ones_mask", "positions_reset_without_mask"):
        assert examine(name).report.probes["perturbation"].value > 1e-2
        assert examine(name, fixed=True).report.probes["perturbation"].value == 0.0


def test_loss_normalisation_check_measures_token_weights():
    short, long = examples(shapes=((6, 1),), seed=1), examples(shapes=((2, 9), (3, 8)), seed=2)
    micro = [collate(short), collate(long)]  # 2 and 19 counted tokens
    bad = check_loss_normalisation(tiny(), micro, mean_of_means)
    assert bad.failed and bad.value == pytest.approx(19 / 2, rel=1e-4), bad.summary
    good = check_loss_normalisation(tiny(), micro, global_token_mean)
    assert not good.failed and good.value == pytest.approx(1.0, abs=1e-4), good.summary
    assert "1/N = 0.0476" in good.summary  # 1/21


def test_counted_labels_check():
    batch = collate(examples())
    assert not check_counted_labels(batch).failed
    batch["labels"] = torch.full_like(batch["labels"], IGNORE_INDEX)
    finding = check_counted_labels(batch)
    assert finding.failed and finding.value == 0 and "0/0" in finding.summary


def test_museum_table_renders_for_docs():
    table = museum_table(["boundary_label", "mean_of_micro_batch_means"])
    md = table.to_markdown()
    assert md.splitlines()[0] == "| bug | link | caught by | fixed version passes |"
    assert "audit: loss_coverage" in md and "museum check: loss_normalisation" in md
    assert "https://github.com/meta-pytorch/torchtune/issues/1177" in md and "| yes |" in md
    assert "<table>" in table._repr_html_() and "boundary_label" in str(table)
    with pytest.raises(PacksimError, match="unknown exhibit"):
        museum_table(["nope"])
