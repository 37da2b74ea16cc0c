"""``str(report)`` fits in 100 columns and keeps everything ``report.table()`` says (issue 23).

Reports of pipelines built here: packsim's buggy packed batch (a worst pair, notes, causes) and a
transformers Trainer with tests/test_evidence.py's collator whose position_ids restart one token
late (every finding, fixes, a long forward line). Long cells wrap inside their column; the
unwrapped ``table()`` keeps one line per probe and per finding (logs, grep).
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")

from pipelines import one_thread  # noqa: E402, F401
from test_evidence import Flatten, trainer_for  # noqa: E402

import packsim  # noqa: E402
from packsim import PackedBatch  # noqa: E402
from packsim.auditing.report import WIDTH, _sentence  # noqa: E402
from packsim.core.model import build_model  # noqa: E402


def flat(text: str) -> str:
    return " ".join(text.split())


def pieces(report) -> list[str]:
    """Everything the report says, each as one string (what the wrapped text must still hold)."""
    out = [report.verdict, report.boundaries, report.forward, *report.causes]
    for p in report.probes.values():
        value = "-" if p.value is None else f"{p.value:.3g}"
        thr = "-" if p.threshold is None else f"{p.threshold:.0e}" if p.threshold else "0"
        out += [f"{p.name} {p.status.upper()} {value} {thr} {p.summary}"]
    for f in report.findings:
        out.append(f"{f.name} {f.status.upper()} {_sentence(f.evidence)}" + (f" Fix: {f.fix}" if f.failed and f.fix else ""))
    if report.worst_pair is not None:
        out.append(f"worst pair: {report.worst_pair}")
    return out


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    from packsim import make_examples

    buggy = packsim.audit(build_model("tiny", seed=0), PackedBatch.from_examples(make_examples(6, seed=0), capacity=32, setup="buggy"))
    late = packsim.audit_trainer(trainer_for("qwen3", Flatten("late"), tmp_path_factory.mktemp("late")))
    fixed = packsim.audit_trainer(trainer_for("mistral", Flatten(), tmp_path_factory.mktemp("fixed")))
    return {"buggy": buggy, "late": late, "fixed": fixed}


@pytest.mark.parametrize("name", ["buggy", "late", "fixed"])
def test_str_fits_100_columns_and_keeps_everything(reports, name):
    report = reports[name]
    text = str(report)
    widths = [len(line) for line in text.splitlines()]
    assert max(widths) <= WIDTH == 100, [line for line in text.splitlines() if len(line) > WIDTH]
    wide = report.table()
    assert max(len(line) for line in wide.splitlines()) > WIDTH  # the case under test: wide before
    for piece in pieces(report):
        assert flat(piece) in flat(text), piece
        assert flat(piece) in flat(wide), piece
    first = text.splitlines()[0]
    assert report.verdict.startswith(first)  # the verdict still comes first
    header = next(line for line in text.splitlines() if line.startswith("probe "))
    assert header.split() == ["probe", "result", "value", "limit", "evidence"]


def test_the_unwrapped_table_keeps_one_line_per_row(reports):
    report = reports["late"]
    lines = report.table().splitlines()
    assert lines[0] == report.verdict
    for p in report.probes.values():
        assert sum(line.startswith(p.name + " ") for line in lines) == 1
        assert any(line.startswith(p.name + " ") and line.endswith(p.summary) for line in lines)
    for f in report.findings:
        assert sum(line.strip().startswith(f.name + " ") for line in lines) == 1
    assert report.table(width=WIDTH) == str(report)


def test_a_narrow_width_puts_the_evidence_below_the_cells(reports):
    text = reports["late"].table(width=60)
    assert max(len(line) for line in text.splitlines()) <= 60
    assert "\nperturbation    FAIL     " in text and "\n    every example packed vs alone" in text
    for piece in pieces(reports["late"]):  # a word longer than 56 columns is cut: compare without spaces
        assert "".join(piece.split()) in "".join(text.split()), piece


def test_console_wraps_on_a_terminal_and_keeps_lines_in_a_log(reports):
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    report = reports["late"]
    assert report.console(Terminal()) == str(report)
    assert report.console(io.StringIO()) == report.table()  # a file or CI log: one line per row, grep-able
