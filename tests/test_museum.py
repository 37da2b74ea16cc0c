"""The museum of real-world packing bugs: every exhibit is caught by the expected probe or check, and
its fixed pipeline passes everything (tiny Llama, fp32, CPU)."""

from __future__ import annotations

import re

import pytest

from packsim import PacksimError
from packsim.exhibits.museum import (
    AUDITED,
    EXHIBITS,
    audit_exhibit,
    museum_table,
)
from packsim.exhibits.museum_at_scale import PIECES_AT_SCALE
from packsim.exhibits.museum_beyond_sft import PUBLIC_BUGS

LINK = re.compile(r"^https://github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+$")
# configuration checks a fixed exhibit may report (passing): the loss ones, and the independent
# evidence that the boundary fields and special tokens agree with the examples
CHECKS = {"counted_labels", "equal_token_weights", "boundary_fields", "special_tokens", "flash_fields"}


def test_the_museum_holds_at_least_eight_documented_bugs():
    assert len(AUDITED) >= 8
    for name, ex in AUDITED.items():
        assert ex.name == name and ex.links and all(LINK.match(link) for link in ex.links), ex.links
        assert len(ex.story) > 200 and ex.expected and ex.evidence, name
    caught_by_audit = [e for e in AUDITED.values() if not e.expected & CHECKS]
    assert len(caught_by_audit) >= 8  # the audit alone catches at least eight of them


def test_exhibits_hold_the_2026_pieces_too():
    assert list(EXHIBITS) == [*AUDITED, *PUBLIC_BUGS, *PIECES_AT_SCALE]
    assert all(EXHIBITS[n] is pieces[n] for pieces in (PUBLIC_BUGS, PIECES_AT_SCALE) for n in pieces)
    for name, piece in {**PUBLIC_BUGS, **PIECES_AT_SCALE}.items():
        assert piece.name == name and piece.links and all(LINK.match(link) for link in piece.links), piece.links
    for name in ("label_roll_across_boundary", "roll_label_across_boundary"):
        with pytest.raises(PacksimError, match="checked by its own probe"):
            audit_exhibit(name)
    with pytest.raises(PacksimError, match="unknown exhibit"):
        audit_exhibit("nope")


def test_museum_table_runs_a_piece_like_an_exhibit():
    md = museum_table(["boundary_label", "label_roll_across_boundary", "roll_label_across_boundary"]).to_markdown()
    assert "https://github.com/verl-project/verl/issues/6475" in md and "packsim.audit: FAIL (loss_coverage)" in md
    assert md.count("| yes |") == 3 and "NOT CAUGHT" not in md


_UNITS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen " \
         "seventeen eighteen nineteen".split()
_TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50}


def _number(word: str) -> int:
    """'seventeen' -> 17, 'twenty-three' -> 23 (the README writes its counts in words)."""
    tens, _, unit = word.lower().partition("-")
    if tens in _TENS:
        return _TENS[tens] + (_UNITS.index(unit) if unit else 0)
    return _UNITS.index(tens)


def test_the_readme_counts_every_bug_of_the_museum():
    """The README's count is the museum's: museum_table() makes one row per name of EXHIBITS."""
    from packsim.core.paths import repo_path

    found = re.findall(r"replays\s+([a-z-]+)\s+packing\s+bugs", repo_path("README.md").read_text())
    assert found and [_number(w) for w in found] == [len(EXHIBITS)] * len(found), (found, len(EXHIBITS))
    assert _number("seventeen") == 17 and _number("twenty-three") == 23 and _number("thirty") == 30


@pytest.mark.parametrize("name", list(AUDITED))
def test_exhibit_is_caught_and_its_fix_passes(name):
    exhibit = AUDITED[name]
    buggy = audit_exhibit(name)
    assert set(buggy.failed) == set(exhibit.expected), buggy.table()
    assert exhibit.evidence in buggy.table(), buggy.table()
    fixed = audit_exhibit(name, fixed=True)
    assert fixed.failed == [] and fixed.ok, fixed.table()
    assert {f.name for f in fixed.findings} <= CHECKS and all(f.status == "pass" for f in fixed.findings)


def test_leak_exhibits_are_real_leaks_and_fixes_are_exact():
    for name in ("all_ones_mask", "positions_reset_without_mask"):
        assert audit_exhibit(name).probes["perturbation"].value > 1e-2
        # the probe's value also compares each example packed vs run alone (other shapes, so
        # float rounding of about 1e-7 in fp32): exact up to that, five orders below the leak
        assert audit_exhibit(name, fixed=True).probes["perturbation"].value < 1e-6


def test_museum_table_renders_for_docs():
    table = museum_table(["boundary_label", "mean_of_micro_batch_means"])
    md = table.to_markdown()
    assert md.splitlines()[0] == "| bug | link | caught by | fixed version passes |"
    assert "audit: loss_coverage" in md and "museum check: equal_token_weights" in md
    assert "https://github.com/meta-pytorch/torchtune/issues/1177" in md and "| yes |" in md
    assert "<table>" in table._repr_html_() and "One example's last token" in str(table)
    with pytest.raises(PacksimError, match="unknown exhibit"):
        museum_table(["nope"])
