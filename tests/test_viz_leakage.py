"""Leakage explorer (packsim.viz): clicks, shares checked against attention_maps, odd input."""

from __future__ import annotations

import re

import pytest
import torch
import traitlets
from toy import BOS, EOS

from packsim.core.attention_share import mean_outside_share
from packsim.core.batch import PackedBatch
from packsim.core.data import make_examples
from packsim.core.errors import PacksimError
from packsim.core.model import attention_maps, build_model
from packsim.viz import leakage_explorer, leakage_figure
from packsim.viz.leakage import share_html
from packsim.viz.leakage_data import key_weights
from packsim.viz.widget import token_glyphs

SHARE = re.compile(r"outside its example: (\d+\.\d)%")


def _outside(weights, seq_row, query: int) -> float:
    """Share of one query's ``weights`` (T,) on keys of another example, summed by hand."""
    return float(weights[seq_row != seq_row[query]].sum())


def _share(panel) -> float:
    m = SHARE.search(panel.share.value)
    assert m, panel.share.value
    return float(m.group(1))


def _n_outside(panel) -> int:
    return panel.attention.value.count("packsim-key-outside")


def _count_changes(root) -> dict:
    """Count trait changes on every widget under ``root`` (each one is a message to the page)."""
    counter = {"n": 0}

    def bump(_change):
        counter["n"] += 1

    def walk(w):
        w.observe(bump, names=traitlets.All)
        for child in getattr(w, "children", ()):
            walk(child)

    walk(root)
    return counter


@pytest.fixture(scope="module")
def explorer():
    """6 examples at capacity 64: row 0 holds examples 0, 2, 4 then one padding token."""
    return leakage_explorer(make_examples(6, seed=0), capacity=64, seed=0)


def _tokens_of(x, example: int) -> list[int]:
    return [k for k, s in enumerate(x.batch.seq_ids[x.row].tolist()) if s == example]


def test_layout_and_css_contract(explorer):
    x = explorer
    assert "packsim-leakage" in x.widget._dom_classes
    T = x.batch.shape[1]
    for name in ("buggy", "correct"):
        p = x.panels[name]
        assert {"packsim-leakage-panel", f"packsim-panel-{name}"} <= set(p.box._dom_classes)
        assert len(p.chips) == T and all("packsim-token" in c._dom_classes for c in p.chips)
        assert [c.description for c in p.chips] == token_glyphs(x.batch.input_ids[0])
        assert "packsim-attention" in p.attention._dom_classes
        assert "packsim-outside-share" in p.share._dom_classes
        assert p.attention.value.count('class="packsim-key') == T


def test_click_third_example_leaks_in_buggy_not_in_correct(explorer):
    x = explorer
    seq = x.batch.seq_ids[0]
    third = sorted({s for s in seq.tolist() if s >= 0}, key=lambda e: _tokens_of(x, e)[0])[2]
    q = _tokens_of(x, third)[-1]  # last token of the third example of the row
    x.panels["buggy"].chips[q].click()
    assert x.query == q
    # expected shares straight from the attention maps (mean over layers and heads)
    for name in ("buggy", "correct"):
        maps = attention_maps(x.models[name], x.batch.with_setup(name))  # (L, B, H, T, T)
        w = maps[:, 0, :, q, :].mean((0, 1))  # (T,)
        expected = float(w[seq != third].sum())
        assert _share(x.panels[name]) == pytest.approx(100 * expected, abs=0.051)
    assert _share(x.panels["buggy"]) > 10.0
    assert "outside its example: 0.0%" in x.panels["correct"].share.value
    assert x.outside_share("correct") == 0.0  # exactly: masked keys get probability 0
    n_before = sum(1 for k in range(q) if int(seq[k]) != third)
    assert _n_outside(x.panels["buggy"]) == n_before  # every earlier key of another example
    assert _n_outside(x.panels["correct"]) == 0


def test_examples_are_named_by_batch_index_and_place_in_the_row(explorer):
    x = explorer
    second = _tokens_of(x, 2)[0]  # row 0 holds examples 0, 2, 4: example 2 is its 2nd
    name = "example 2 of the batch (2nd in this row)"
    assert name in x.panels["buggy"].chips[second].tooltip
    x.select(second)
    assert name in x.panels["buggy"].share.value and name in x.panels["correct"].share.value
    assert f'title="key {second} ' in x.panels["buggy"].attention.value
    assert name in x.panels["buggy"].attention.value
    assert "numbered by their index in the batch" in x.header.value
    x.select(None)


def test_first_example_sees_nothing_outside_even_buggy(explorer):
    x = explorer
    first = int(x.batch.seq_ids[0, 0])
    x.panels["correct"].chips[_tokens_of(x, first)[-1]].click()  # a click in either panel
    assert "outside its example: 0.0%" in x.panels["buggy"].share.value
    assert _n_outside(x.panels["buggy"]) == 0


def test_selection_outline_moves_and_layer_head_change_the_view(explorer):
    x = explorer
    a, b = 30, 50
    x.panels["buggy"].chips[a].click()
    x.panels["buggy"].chips[b].click()
    for p in x.panels.values():
        assert [k for k, c in enumerate(p.chips) if "packsim-selected" in c._dom_classes] == [b]
    mean_share = x.outside_share("buggy")
    x.layer.value, x.head.value = 1, 2
    w = key_weights(x.maps["buggy"], 0, b, 1, 2)
    assert x.outside_share("buggy") == pytest.approx(_outside(w, x.batch.seq_ids[0], b))
    assert x.outside_share("buggy") != pytest.approx(mean_share)
    assert _share(x.panels["buggy"]) == pytest.approx(100 * x.outside_share("buggy"), abs=0.051)
    assert "outside its example: 0.0%" in x.panels["correct"].share.value
    x.layer.value, x.head.value = "mean", "mean"


def test_messages_per_click_are_few_and_repeats_send_none(explorer):
    x = explorer
    x.select(10)
    counter = _count_changes(x.widget)
    x.panels["buggy"].chips[40].click()
    # per panel: outline off the old chip, on the new one, attention view, share line; plus
    # the keyboard's query slider following the click
    assert 0 < counter["n"] <= 4 * len(x.panels) + 1
    n = counter["n"]
    for _ in range(25):  # rapid repeated clicks on the same chip change nothing
        x.panels["buggy"].chips[40].click()
    assert counter["n"] == n


def test_rapid_alternating_clicks_end_in_a_consistent_state(explorer):
    x = explorer
    T = x.batch.shape[1]
    for i in range(60):
        x.panels["buggy" if i % 2 else "correct"].chips[(7 * i) % T].click()
    last = (7 * 59) % T
    assert x.query == last
    for p in x.panels.values():
        assert [k for k, c in enumerate(p.chips) if "packsim-selected" in c._dom_classes] == [last]
    assert _share(x.panels["buggy"]) == pytest.approx(100 * x.outside_share("buggy"), abs=0.051)


def test_padding_and_last_token_do_not_crash(explorer):
    x = explorer
    T = x.batch.shape[1]
    pad = int((x.batch.seq_ids[0] < 0).nonzero()[0])
    x.panels["buggy"].chips[pad].click()
    assert "padding" in x.panels["buggy"].share.value
    assert _share(x.panels["buggy"]) > 0  # padding under a causal row reads every example
    assert "outside its example: 0.0%" in x.panels["correct"].share.value  # its own segment
    x.panels["correct"].chips[T - 1].click()
    assert x.query == T - 1
    x.select(None)
    assert "click a token" in x.panels["buggy"].share.value
    assert all("packsim-selected" not in c._dom_classes for c in x.panels["buggy"].chips)


def test_row_switch_rebuilds_chips(explorer):
    x = explorer
    assert x.batch.shape[0] == 2 and not x.row_picker.disabled
    x.select(5)
    x.row_picker.value = 1
    assert x.row == 1 and x.query is None
    glyphs = token_glyphs(x.batch.input_ids[1])
    assert [c.description for c in x.panels["buggy"].chips] == glyphs
    x.panels["buggy"].chips[40].click()
    w = key_weights(x.maps["buggy"], 1, 40)
    assert x.outside_share("buggy") == pytest.approx(_outside(w, x.batch.seq_ids[1], 40))
    x.row_picker.value = 0


def test_one_example_pack():
    x = leakage_explorer(make_examples(1, seed=3), capacity=48)
    assert x.batch.shape == (1, 48) and x.row_picker.disabled
    n = int((x.batch.seq_ids[0] >= 0).sum())
    for q in (0, n // 2, n - 1):
        x.panels["buggy"].chips[q].click()
        for p in x.panels.values():
            assert "outside its example: 0.0%" in p.share.value
            assert _n_outside(p) == 0


def test_example_of_length_one():
    """A 1-token example (only possible through the collator format) between two others."""
    ids = [BOS, 5, 6, EOS, 7, BOS, 8, 9, EOS]
    features = {"input_ids": ids, "cu_seq_lens_q": torch.tensor([0, 4, 5, 9], dtype=torch.int32)}
    batch = PackedBatch.from_flattening(features, setup="correct")
    x = leakage_explorer(batch)
    x.panels["buggy"].chips[4].click()  # the 1-token example: attends to itself and, buggy, before
    assert _share(x.panels["buggy"]) > 0
    assert "outside its example: 0.0%" in x.panels["correct"].share.value
    w = key_weights(x.maps["correct"], 0, 4)
    assert float(w[4]) == pytest.approx(1.0)  # all of its attention on itself


def test_two_trained_models_one_per_panel():
    ex = make_examples(4, seed=1)
    models = {"buggy": build_model("tiny", seed=1), "correct": build_model("tiny", seed=2)}
    x = leakage_explorer(ex, models=models, capacity=64)
    assert "each panel uses the model trained under its setup" in x.header.value
    last = int((x.batch.seq_ids[0] >= 0).sum()) - 1
    x.select(last)
    maps = attention_maps(models["buggy"], x.batch.with_setup("buggy"))
    w = maps[:, 0, :, last, :].mean((0, 1))
    seq = x.batch.seq_ids[0]
    assert x.outside_share("buggy") == pytest.approx(float(w[seq != seq[last]].sum()))
    assert x.outside_share("correct") == 0.0


def test_bad_input_raises_packsim_error(explorer):
    with pytest.raises(PacksimError, match="unknown setup"):
        leakage_explorer(make_examples(3), models={"nonsense": build_model("tiny")})
    with pytest.raises(PacksimError, match="models must be a dict"):
        leakage_explorer(make_examples(3), models=[build_model("tiny")])
    with pytest.raises(PacksimError, match="not a token of the row"):
        explorer.select(10_000)
    with pytest.raises(PacksimError, match="layer"):
        key_weights(explorer.maps["buggy"], 0, 3, layer=7)
    with pytest.raises(PacksimError, match="list of examples or a PackedBatch"):
        leakage_explorer("abc")
    padded = PackedBatch.from_examples(make_examples(3), 64, setup="padded")
    with pytest.raises(PacksimError, match="one example per row"):
        leakage_explorer(padded)


def test_static_figure_titles_and_rows(explorer):
    fig = leakage_figure(make_examples(6, seed=0), capacity=64, seed=0, query=30)
    titles = [a.text.replace("<br>", " ") for a in fig.layout.annotations]  # wrapped to fit
    assert (
        titles[0].startswith("buggy: ")
        and titles[1] == "correct: 0.0% of attention outside its example"
    )
    buggy = float(re.search(r"(\d+\.\d)%", titles[0]).group(1))
    maps = explorer.maps["buggy"][:, 0].mean((0, 1))  # (T, T)
    assert buggy == pytest.approx(
        100 * mean_outside_share(maps[None, None], explorer.batch.seq_ids[0][None]), abs=0.051
    )
    heatmaps = [t for t in fig.data if t.type == "heatmap"]  # one per setup (+ boundary lines)
    z = torch.tensor(heatmaps[1].z)  # correct: rows of real queries sum to 1, nothing across
    real = explorer.batch.seq_ids[0] >= 0
    assert torch.allclose(z[real].sum(-1), torch.ones(int(real.sum())), atol=1e-5)
    assert mean_outside_share(z[None, None], explorer.batch.seq_ids[0][None]) == 0.0
    assert explorer.figure().data[0].type == "heatmap"


def test_share_text_reads_zero_only_when_exactly_zero():
    assert "outside its example: 0.0%" in share_html(0.0, 3, "token 3")
    # the verdict's colour is the theme's (widget.css classes), and it is said in words too
    assert 'class="packsim-ok"' in share_html(0.0, 3, "token 3") and "isolated" in share_html(0.0, 3, "t")
    assert 'class="packsim-bad"' in share_html(0.3721, 3, "token 3") and "leak" in share_html(0.3721, 3, "t")
    assert "outside its example: 37.2%" in share_html(0.3721, 3, "token 3")
    tiny = share_html(1e-6, 3, "token 3")
    assert "0.0%" not in tiny and "&lt;0.05%" in tiny
    assert "click a token" in share_html(None, None, "")
