"""packsim.experiment.peak_memory: the RSS rise of one call (Linux only; elsewhere it returns None)."""

from __future__ import annotations

import pytest
import torch

from packsim.experiment.peak_memory import peak_rise_mib, rss_mib

linux_only = pytest.mark.skipif(rss_mib() is None, reason="needs /proc/self/status (Linux)")


@linux_only
def test_a_large_temporary_shows_in_the_peak():
    def make_and_drop():
        x = torch.ones(32 * 2**20)  # 128 MiB of fp32, freed on return
        return float(x[0])

    rise = peak_rise_mib(make_and_drop)
    assert rise is not None and 100 <= rise < 400


@linux_only
def test_freed_memory_does_not_count_for_the_next_call():
    peak_rise_mib(lambda: torch.ones(32 * 2**20).sum())  # 128 MiB, freed
    assert peak_rise_mib(lambda: None) < 50


def test_returns_a_float_or_none():
    rise = peak_rise_mib(lambda: None)
    assert rise is None or rise >= 0.0
