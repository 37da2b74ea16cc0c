"""packsim.viz.scaling: lesson 10's token-weight heatmap (and its sliders), ranks vs one process, rank loads."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from packsim.viz import (
    rank_loads_figure,
    ranks_vs_one_figure,
    token_weights_explorer,
    token_weights_figure,
)
from packsim.viz.widget import shown_figure


def test_token_weights_figure_shows_each_normalisers_weight_of_one_token():
    counts = torch.tensor([[3, 1], [2, 6]])  # 12 tokens
    heat = token_weights_figure(counts).data[0]
    assert list(heat.y) == ["global", "local", "mean"] and len(heat.x) == 4
    z = [list(row) for row in heat.z]
    assert z[0] == pytest.approx([1 / 12] * 4)  # global: every token 1 / total
    assert z[1] == pytest.approx([1 / 8, 1 / 8, 1 / 16, 1 / 16])  # local: 1 / (R * rank count)
    assert z[2] == pytest.approx([1 / 12, 1 / 4, 1 / 8, 1 / 24])  # mean: 1 / (R * M * cell count)


def test_explorer_sliders_redraw_the_table():
    view = token_weights_explorer(40, 105)
    assert view.counts().tolist() == [[20, 20], [35, 70]]
    view.sliders[1].value = 30
    assert view.counts().tolist() == [[20, 20], [10, 20]]
    shown = shown_figure(view.out)
    assert shown["data"][0]["z"][0] == pytest.approx([1 / 70] * 4)


def _output(losses, normalise, weight):
    return {"losses": {"response_loss": losses}, "run": SimpleNamespace(extra={"normalise": normalise}),
            "state": {"w": torch.tensor([weight])}}


def test_ranks_vs_one_figure_plots_the_gaps_and_weight_differences():
    runs = {"one": _output([2.0, 1.5], None, 0.0), "2x2-global": _output([2.0, 1.5], "global", 1e-7),
            "2x2-local": _output([2.0, 1.7], "local", 0.01)}
    fig = ranks_vs_one_figure(runs)
    bars = [t for t in fig.data if t.type == "bar"][0]
    assert list(bars.x) == ["2x2-global", "2x2-local"] and list(bars.y) == pytest.approx([1e-7, 0.01])
    gaps = {t.name: list(t.y) for t in fig.data if t.xaxis == "x2"}
    assert gaps["2x2-local"] == pytest.approx([1e-9, 0.2])  # |1.7 - 1.5|, 0 floored for the log axis


def test_rank_loads_figure_names_each_methods_straggler_ratio():
    fig = rank_loads_figure({"none": [1, 3], "balanced": [2, 2]})
    assert [t.name for t in fig.data] == ["none: ratio 1.50", "balanced: ratio 1.00"]
