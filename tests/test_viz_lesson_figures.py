"""The figures lessons 02 and 08 draw from the library (packsim.viz), each checked against its inputs."""

from __future__ import annotations

import math

import pytest
import torch

from packsim.core.errors import PacksimError
from packsim.core.masks import block_diagonal_mask, causal_mask
from packsim.experiment.results import RunResult
from packsim.viz import (
    allowed_pairs_figure,
    outside_share_figure,
    reported_loss_figure,
    varlen_bench_figure,
)

SEQ = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, -1, -1])  # (T,): three examples, then padding


def test_allowed_pairs_figure_blank_where_masked_and_coloured_by_the_key_example():
    masks = {"causal": causal_mask(len(SEQ)), "block-diagonal": block_diagonal_mask(SEQ)}
    fig = allowed_pairs_figure(masks, SEQ)
    assert [a.text for a in fig.layout.annotations] == list(masks)
    for trace, (name, _) in zip(fig.data, masks.items(), strict=True):
        z = trace.z
        for q in range(len(SEQ)):
            for k in range(len(SEQ)):
                # ground truth written out: causal = key not after query; block-diagonal also same example
                allowed = k <= q and (name == "causal" or SEQ[q] == SEQ[k] != -1)
                if allowed:
                    assert z[q][k] == SEQ[k].item() + 1, (name, q, k)
                else:
                    assert math.isnan(z[q][k]), (name, q, k)
    with pytest.raises(PacksimError, match=r"must be \(10, 10\)"):
        allowed_pairs_figure({"causal": causal_mask(4)}, SEQ)
    with pytest.raises(PacksimError, match="masks is empty"):
        allowed_pairs_figure({}, SEQ)


def test_outside_share_figure_bars_per_model_reference_line_and_boundaries():
    shares = {"a": torch.linspace(0, 0.9, 10), "b": torch.full((10,), 0.5), "uniform": torch.arange(10) / 10}
    fig = outside_share_figure(shares, SEQ, reference="uniform")
    bars = [t for t in fig.data if t.type == "bar"]
    lines = [t for t in fig.data if t.type == "scatter"]
    assert [t.name for t in bars] == ["a", "b"] and [t.name for t in lines] == ["uniform"]
    real = [i for i in range(10) if SEQ[i] >= 0]  # padding is left out
    for t in (*bars, *lines):
        assert list(t.x) == real
        assert list(t.y) == pytest.approx([shares[t.name][i].item() for i in real])
    assert sorted(s.x0 for s in fig.layout.shapes) == [2.5, 4.5]  # examples 1 and 2 start at 3 and 5
    assert fig.layout.yaxis.tickformat == ".0%"
    with pytest.raises(PacksimError, match="reference 'nope'"):
        outside_share_figure(shares, SEQ, reference="nope")
    with pytest.raises(PacksimError, match=r"must be \(T,\)"):
        outside_share_figure({"a": torch.zeros(3)}, SEQ)


def test_reported_loss_figure_draws_the_run_curve():
    run = RunResult("buggy", seed=0)
    with pytest.raises(PacksimError, match="no training records"):
        reported_loss_figure(run)
    run.curves["train"]["step"] = [1, 2, 3]
    run.curves["train"]["reported_loss"] = [3.0, 2.5, 2.25]
    fig = reported_loss_figure(run)
    assert list(fig.data[0].x) == [1, 2, 3] and list(fig.data[0].y) == [3.0, 2.5, 2.25]
    assert "'buggy'" in fig.layout.title.text


def test_varlen_bench_figure_medians_and_memory_per_size():
    sizes = [256, 512]
    bench = {
        ("dense", 256): {"times": [0.3, 0.1, 0.2], "mem": 4.0},
        ("dense", 512): {"times": [0.9, 0.5, 0.4, 0.6], "mem": None},  # even count: the upper median
        ("blocked", 256): {"times": [0.1], "mem": 1.0},
        ("blocked", 512): {"times": [0.2, 0.2, 0.3], "mem": 2.0},
    }
    fig = varlen_bench_figure(bench, sizes)
    by = {(t.name, t.xaxis): t for t in fig.data}
    assert list(by["dense", "x"].y) == [0.2, 0.6]  # sorted(times)[len // 2]
    assert list(by["blocked", "x"].y) == [0.1, 0.2]
    assert list(by["dense", "x2"].y) == [4.0, None] and list(by["blocked", "x2"].y) == [1.0, 2.0]
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    del bench["blocked", 512]
    with pytest.raises(PacksimError, match=r"\('blocked', 512\)"):
        varlen_bench_figure(bench, sizes)
