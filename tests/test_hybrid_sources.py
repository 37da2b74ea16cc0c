"""packsim.exhibits.hybrid_sources: the source reading of which calls drop seq_idx, held against a measurement.

tests/installed.py measures whether seq_idx reaches each family's stateful layers (logits with and
without it, on the reference kernels); the ast reading must agree on every hybrid family, and each
reason it gives must point at a line of the installed transformers that holds what it quotes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from installed import reads_seq_idx

from packsim.exhibits.hybrid_sources import dropped_seq_idx, family_why

CARRYING = ["mamba2", "falcon_h1", "bamba", "lfm2", "zamba2"]  # seq_idx alone is meant to isolate these


def quoted_line(reason: str) -> str:
    """The installed source line a reason's 'transformers/...py:LINE' names."""
    import transformers

    path, line = re.search(r"\(?(transformers/[\w/]+\.py):(\d+)", reason).groups()
    root = Path(transformers.__file__).parent.parent
    return (root / path).read_text().splitlines()[int(line) - 1]


@pytest.mark.parametrize("family", CARRYING)
def test_the_reading_agrees_with_the_measurement(family):
    assert (dropped_seq_idx(family) == []) == reads_seq_idx(family), dropped_seq_idx(family)


@pytest.mark.parametrize("family", CARRYING)
def test_each_dropped_call_names_its_line(family):
    if not dropped_seq_idx(family):
        pytest.skip(f"{family}: the installed transformers drops seq_idx on no call (the window's low end does)")
    for reason in dropped_seq_idx(family):
        callee = reason.split(" calls ")[1].split(" without")[0]
        assert callee + "(" in quoted_line(reason), reason


def test_family_why_names_the_line_that_decides():
    assert "mask_kwargs = {" in quoted_line(family_why("granitemoehybrid"))
    assert "cu_seqlens=" in quoted_line(family_why("qwen3_next"))
    assert family_why("lfm2") == ""  # seq_idx reaches its conv: nothing more to say
