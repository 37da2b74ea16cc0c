"""Packing playground, mask explorer, label viewer, tile map, and the shared widget plumbing."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import plotly.io as pio
import pytest
import torch

from packsim.core.batch import PackedBatch
from packsim.core.data import make_examples
from packsim.core.errors import PacksimError
from packsim.core.loss import Role
from packsim.core.masks import block_diagonal_mask, block_sparsity, flex_block_mask
from packsim.core.pack_stats import packing_stats
from packsim.core.packing import Piece, pack
from packsim.core.tiles import attention_work
from packsim.core.tokenizer import BOS_ID, EOS_ID, PAD_ID, encode
from packsim.viz import (
    label_viewer,
    labels_figure,
    mask_explorer,
    mask_figure,
    packing_figure,
    packing_playground,
    tile_figure,
    tile_map,
    trap_explorer,
    trap_figure,
)
from packsim.viz.labels import counted_targets, label_reason
from packsim.viz.style import (
    CHAR_WIDTH,
    DESIGN_WIDTH,
    FIGURE_CONFIG,
    LINE_HEIGHT,
    SUBPLOT_TITLE_SIZE,
    TITLE_SIZE,
    figure_config,
    layout,
    text_lines,
    use_figure_config,
)
from packsim.viz.tiles import as_cu_seqlens
from packsim.viz.widget import example_name, figure_bundle, shown_figure, token_glyphs

# ----------------------------------------------------------------------------- shared plumbing


def test_token_glyphs():
    ids = [BOS_ID, *encode("a b"), EOS_ID, PAD_ID, 999]
    assert token_glyphs(ids) == ["<bos>", "a", "␣", "b", "<eos>", "·pad", "#999"]
    assert token_glyphs(torch.tensor(ids[:2])) == ["<bos>", "a"]


@pytest.mark.parametrize(
    "make, css",
    [
        (lambda: packing_playground(n=20, capacity=128), "packsim-playground"),
        (lambda: mask_explorer(), "packsim-mask-explorer"),
        (lambda: tile_map([40, 20], tile=16), "packsim-tiles"),
        (lambda: trap_explorer(), "packsim-traps"),
    ],
)
def test_plotly_widgets_show_a_figure_bundle(make, css):
    w = make()
    assert css in w.widget._dom_classes and callable(w._ipython_display_)
    (output,) = w.out.outputs
    assert output["output_type"] == "display_data"
    bundle = output["data"]
    assert set(bundle) == {"application/vnd.plotly.v1+json", "text/plain"}
    json.dumps(bundle)  # goes over the wire as JSON
    assert shown_figure(w.out)["data"]
    assert w.figure().to_dict()["data"]
    assert shown_figure(w.out)["config"] == figure_config()  # offline: no logo, no cloud button


def test_importing_viz_and_drawing_a_figure_change_no_plotly_renderer():
    """No global side effect on import: plotly's renderers change only on use_figure_config()."""
    code = ("import plotly.io as pio\n"
            "before = {n: dict(pio.renderers[n].config or {}) for n in pio.renderers if hasattr(pio.renderers[n], 'config')}\n"
            "import packsim, packsim.viz\n"
            "from packsim.viz import packing_figure, mask_figure\n"
            "packing_figure([10, 20, 30], 64)\n"
            "after = {n: dict(pio.renderers[n].config or {}) for n in before}\n"
            "assert before == after, (before, after)\n"
            "packsim.viz.use_figure_config()\n"
            "assert pio.renderers['notebook'].config['displaylogo'] is False\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_offline_figure_config_everywhere(monkeypatch):
    assert FIGURE_CONFIG["displaylogo"] is False and FIGURE_CONFIG["showSendToCloud"] is False
    assert "sendChartToCloud" in FIGURE_CONFIG["modeBarButtonsToRemove"]
    fig = packing_figure([10, 20, 30], 64)
    use_figure_config()  # what each lesson's first cell calls
    # a plain fig.show() now follows the offline config on every plotly.io renderer
    for name in ("plotly_mimetype", "notebook", "notebook_connected", "colab", "browser", "iframe"):
        config = pio.renderers[name].config
        assert all(config.get(k) == v for k, v in figure_config().items()), (name, config)
    mime = pio.renderers._build_mime_bundle(fig.to_dict(), "plotly_mimetype")
    assert mime["application/vnd.plotly.v1+json"]["config"] == figure_config()
    page = pio.renderers._build_mime_bundle(fig.to_dict(), "notebook_connected")["text/html"]
    assert '"displaylogo": false' in page and '"showSendToCloud": false' in page
    monkeypatch.setenv("PACKSIM_STATIC", "1")  # static site: HTML drawn by the page's plotly.js
    html = figure_bundle(fig)["text/html"]
    assert '"displaylogo": false' in html and '"showSendToCloud": false' in html
    assert "responsive" not in FIGURE_CONFIG  # plotly's to_html got a copy, not the original


def _figures():
    from packsim.experiment.results import Results, RunResult, StepRecord
    from packsim.viz import curves_figure, leakage_figure, quiz_figure
    from packsim.viz.comparison_report import copies_figure

    runs = []
    for setup in ("buggy", "correct"):
        r = RunResult(setup=setup, seed=0, data="facts")
        for s in (1, 2, 3):
            values = {"reported_loss": 1 / s, "response_loss": 1 / s,
                      "response_loss_first": 1 / s, "response_loss_repeat": 2 / s}  # fmt: skip
            r.add(StepRecord("train", setup, 0, s, values))
            r.add(StepRecord("eval", setup, 0, s, {"isolated_exact_match": s / 3,
                                                   "isolated_response_loss": 1 / s}))  # fmt: skip
        runs.append(r)
    results = Results(runs=runs, config={}, env={})
    ex = make_examples(4, seed=0)
    return {
        "curves": lambda: curves_figure(results),
        "copies": lambda: copies_figure(results),
        "mask": lambda: mask_figure(),
        "tiles": lambda: tile_figure(),
        "leakage": lambda: leakage_figure(ex, capacity=48),
        "labels": lambda: labels_figure(),
        "packing": lambda: packing_figure([10, 20, 30], 64),
        "quiz": lambda: quiz_figure(),
        "traps": lambda: trap_figure(mask="ones"),
    }


@pytest.mark.parametrize("name", list(_figures()))
def test_no_title_collides_with_another(name):
    """At DESIGN_WIDTH, subplot titles fit beside each other and sit below the figure title."""
    fig = _figures()[name]()
    lay = fig.layout
    plot_px = DESIGN_WIDTH - lay.margin.l - lay.margin.r
    assert lay.title.yref == "container" and lay.title.y == 1 and lay.title.yanchor == "top"
    title_bottom = lay.title.pad.t + len(text_lines(lay.title.text)) * LINE_HEIGHT * TITLE_SIZE
    assert title_bottom <= lay.margin.t
    subs = [a for a in lay.annotations if a.yref == "paper" and a.yanchor == "bottom"]
    for a in subs:  # above its panel, below the figure title
        size = a.font.size
        assert size == SUBPLOT_TITLE_SIZE
        assert lay.margin.t - len(text_lines(a.text)) * LINE_HEIGHT * size >= title_bottom, a.text
    rows: dict[float, list] = {}
    for a in subs:
        rows.setdefault(a.y, []).append(a)
    for row in rows.values():  # neighbours in a row do not overlap horizontally
        row.sort(key=lambda a: a.x)
        half = [max(map(len, text_lines(a.text))) * CHAR_WIDTH * a.font.size / plot_px / 2
                for a in row]  # fmt: skip
        for i in range(len(row) - 1):
            assert row[i + 1].x - row[i].x >= half[i] + half[i + 1], (row[i].text, row[i + 1].text)


def test_layout_wraps_long_titles_and_sizes_the_top_margin():
    from plotly.subplots import make_subplots

    long = "a fairly long subplot title that cannot fit one column of three"
    fig = make_subplots(rows=1, cols=3, subplot_titles=(long, "b", "c"))
    layout(fig, "one line", 300, below="legend")
    first = fig.layout.annotations[0].text
    assert "<br>" in first and first.replace("<br>", " ") == long
    assert fig.layout.legend.yref == "container" and fig.layout.legend.orientation == "h"
    assert fig.layout.legend.bgcolor == "rgba(0,0,0,0)"  # no white box on a dark page
    one = fig.layout.margin.t
    layout(fig, "two<br>lines", 300)
    assert fig.layout.margin.t > one and fig.layout.margin.b < 95


def test_example_name_says_which_numbering():
    row = torch.tensor([5, 5, 3, 3, 1, -1])
    assert example_name(3, row) == "example 3 of the batch (2nd in this row)"
    assert example_name(5, row) == "example 5 of the batch (1st in this row)"
    assert example_name(1, row) == "example 1 of the batch (3rd in this row)"
    assert example_name(-1, row) == "padding"
    many = torch.arange(13)
    assert example_name(10, many).endswith("(11th in this row)")
    assert example_name(12, many).endswith("(13th in this row)")


# ----------------------------------------------------------------------------- playground


def _bars_per_pack(fig: dict) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for t in fig["data"]:
        for x, y in zip(t["x"], t["y"], strict=True):
            out.setdefault(x, []).append(y)
    return out


def test_playground_bars_and_numbers_follow_the_controls():
    p = packing_playground(n=60, capacity=256, strategy="bfd", seed=1)
    lengths = p.lengths()
    assert len(lengths) == 60 and lengths.max() <= 256
    for strategy in ("ffd", "wrapped", "bfd"):
        p.strategy.value = strategy
        packs = pack(lengths, 256, strategy=strategy)
        stats = packing_stats(lengths, packs, 256)
        bars = _bars_per_pack(shown_figure(p.out))
        assert len(bars) == stats.n_packs
        assert sum(map(sum, bars.values())) == int(lengths.sum())
        assert all(sum(v) <= 256 for v in bars.values())
        assert f"{stats.n_packs} rows (lower bound {stats.lower_bound})" in p.stats.value
        assert f"fill {stats.fill_ratio:.1%}" in p.stats.value
        assert f"{stats.one_per_row_padding_waste:.1%}" in p.stats.value
    wrapped = _bars_per_pack(packing_figure(lengths, 256, "wrapped").to_dict())
    assert all(sum(wrapped[i]) == 256 for i in range(len(wrapped) - 1))  # wrapped fills every row
    cut = sum(isinstance(e, Piece) for pk in pack(lengths, 256, "wrapped") for e in pk)
    assert cut > 0 and re.search(
        r"<td>wrapped</td><td>\d+</td><td>\d+</td><td>[\d.]+%</td><td>[1-9]", p.stats.value
    )


def test_playground_controls_and_edges():
    p = packing_playground(n=30, capacity=128)
    assert p.uniform_range.disabled and not p.median.disabled
    assert p.distribution.value == "long_tailed" and p.distribution.label == "long-tailed"
    old_spelling = packing_playground(n=30, capacity=128, distribution="long-tailed")
    assert old_spelling.lengths().tolist() == p.lengths().tolist()  # the old key still reads
    p.distribution.value = "uniform"
    assert not p.uniform_range.disabled and p.median.disabled
    p.uniform_range.value = (10, 20)
    assert p.lengths().min() >= 10 and p.lengths().max() <= 20
    p.n.value = 1  # a single example
    assert len(_bars_per_pack(shown_figure(p.out))) == 1
    p.capacity.value = 64
    p.uniform_range.value = (1, 4096)  # clipped to the capacity
    assert p.lengths().max() <= 64
    with pytest.raises(PacksimError, match="capacity"):
        packing_playground(capacity=100)
    with pytest.raises(PacksimError):
        packing_figure([10, 20], 16, "bfd")  # an example longer than the capacity


# ----------------------------------------------------------------------------- mask explorer


def test_mask_explorer_heatmaps_and_block_counts():
    batch = PackedBatch.from_examples(make_examples(6, seed=0), 64)
    m = mask_explorer(batch, block_size=16)
    fig = shown_figure(m.out)
    causal, block, blocks = fig["data"][:3]
    T = 64
    assert torch.equal(torch.tensor(causal["z"]), torch.ones(T, T, dtype=torch.long).tril())
    assert torch.equal(torch.tensor(block["z"]), block_diagonal_mask(batch.seq_ids[0]).long())
    ref = block_sparsity(flex_block_mask(batch.seq_ids[0], block_size=16))
    assert torch.equal(torch.tensor(blocks["z"], dtype=torch.int8), ref.grid[0, 0])
    assert (
        f"{ref.full} full, {ref.partial} partial, {ref.skipped} skipped of {ref.total}"
        in m.counts.value
    )
    plain = block_sparsity(flex_block_mask(torch.zeros(T, dtype=torch.long), block_size=16))
    assert f"<b>plain causal</b>: {plain.full} full" in m.counts.value
    assert ref.skipped > plain.skipped  # cross-example blocks are skipped too
    m.block.value = 8
    assert torch.tensor(shown_figure(m.out)["data"][2]["z"]).shape == (8, 8)
    m.row.value = 1
    ref1 = block_sparsity(flex_block_mask(batch.seq_ids[1], block_size=8))
    assert f"{ref1.skipped} skipped of {ref1.total}" in m.counts.value


def test_mask_figure_axes_span_the_tokens_and_blocks():
    fig = mask_figure(make_examples(6, seed=0), capacity=64, block_size=16)
    for i in ("", "2"):
        assert tuple(fig.layout[f"xaxis{i}"].range) == (-0.5, 63.5)
        assert tuple(fig.layout[f"yaxis{i}"].range) == (63.5, -0.5)
    assert tuple(fig.layout.xaxis3.range) == (-0.5, 3.5)  # 4 blocks of 16
    grid = [t for t in fig.data if t.type == "scatter"]  # the block grid: one trace per token map
    assert len(grid) == 2 and {x for x in grid[0].x if x is not None} >= {15.5, 31.5, 47.5}


@pytest.mark.parametrize("T, block, step", [(64, 16, 1), (64, 4, 2), (128, 8, 2), (64, 64, 1)])
def test_mask_figure_ticks_are_whole_blocks_and_token_panels_have_numbers(T, block, step):
    """Every panel shows tick numbers; the Flex panel's ticks are whole block indices 0, 1, ...
    (never -0.5 or 0.5), at most ~8 a side, and the token panels tick at those blocks' first
    tokens, so a tick of panel 3 and one of panels 1-2 name the same place."""
    batch = PackedBatch.from_examples(make_examples(12, seed=0), T, setup="correct")
    fig = mask_figure(batch, capacity=T, block_size=block)
    n = -(-T // block)
    assert step == -(-n // 8)
    for ax in ("x", "y"):
        flex = fig.layout[f"{ax}axis3"]
        assert (flex.tickmode, flex.tick0, flex.dtick, flex.showticklabels) == ("linear", 0, step, True)
        assert flex.title.text.endswith(f"({block} tokens each)")
        for i in ("", "2"):
            tok = fig.layout[f"{ax}axis{i}"]
            assert (tok.tickmode, tok.tick0, tok.dtick, tok.showticklabels) == ("linear", 0, step * block, True)


def test_mask_figure_one_example_and_bad_block():
    fig = mask_figure(make_examples(1, seed=2), capacity=32, block_size=8)
    assert fig.data[2].type == "heatmap"
    with pytest.raises(PacksimError, match="block_size"):
        mask_explorer(block_size=0)


# ----------------------------------------------------------------------------- label viewer


def _spans(html: str) -> list[tuple[str, str]]:
    return re.findall(
        r'class="packsim-label-token[^"]*?(packsim-counted|packsim-ignored)"[^>]*title="([^"]*)"',
        html,
    )


def test_label_viewer_counts_and_reasons():
    batch = PackedBatch.from_examples(make_examples(5, seed=0), 64)
    v = label_viewer(batch)
    assert "packsim-labels" in v.widget._dom_classes
    html = v.view.value
    T = 64
    spans = _spans(html)
    assert len(spans) == 2 * T  # buggy row, then correct row
    buggy, correct = spans[:T], spans[T:]
    roles = batch.roles[0].tolist()
    # completion-only: exactly the response and EOS tokens are counted
    want = [r in (Role.RESPONSE, Role.EOS) and k > 0 for k, r in enumerate(roles)]
    assert [c == "packsim-counted" for c, _ in correct] == want
    # loss on all tokens: everything but the first token of the row
    assert [c == "packsim-counted" for c, _ in buggy] == [k > 0 for k in range(T)]
    n_buggy = int((batch.with_setup("buggy").labels[0, 1:] != -100).sum())
    assert f"{n_buggy} counted targets" in html
    k_boundary = roles.index(Role.BOUNDARY)
    assert "boundary bug" in buggy[k_boundary][1] and "ignored" in correct[k_boundary][1]
    k_pad = roles.index(Role.PAD)
    assert "trained to predict padding" in buggy[k_pad][1]
    assert "EOS: counted" in correct[roles.index(Role.EOS)][1]
    v.setups.value = ()
    assert "Select at least one setup" in v.view.value
    v.setups.value = ("loss_fix",)
    assert len(_spans(v.view.value)) == T


def test_label_reasons_and_static_figure():
    assert "never a target" in label_reason(Role.FIRST, False)
    assert counted_targets(torch.tensor([5, -100, 7])) == [False, False, True]
    fig = labels_figure(make_examples(3, seed=1), setups=("buggy", "correct", "mask_fix"))
    z = fig.data[0].z
    assert len(z) == 3 and z[0] == z[2] and z[0] != z[1]  # mask_fix keeps loss on all tokens
    assert fig.data[0].y[1].startswith("correct (")


# ----------------------------------------------------------------------------- tile map


def test_tile_map_widget_numbers_and_bad_input():
    t = tile_map()
    w = attention_work(as_cu_seqlens([100, 300, 28, 340, 256]), tile=128)
    assert f"skips <b>{w.tiles_skipped} of {w.tiles_total}</b>" in t.numbers.value
    assert f"{w.varlen_pairs:,}" in t.numbers.value and f"{w.saving:.1f}x fewer" in t.numbers.value
    t.tile.value = 32
    assert "tiles of 32" in t.numbers.value
    before = t.numbers.value
    t.lengths.value = "12, x"  # bad input: a message, the last good view stays
    assert "could not read" in t.message.value and t.numbers.value == before
    t.lengths.value = "7"  # one short sequence
    assert t.message.value == "" and "7 tokens in 1 sequences" in t.numbers.value
    t.lengths.value = "9000"
    t.tile.value = 16
    assert "at most 256" in t.message.value
    batch = PackedBatch.from_examples(make_examples(6, seed=0), 64)
    fig = tile_figure(batch, tile=16, row=1)
    lens = [s.stop - s.start for s in batch.segments if s.row == 1]
    assert fig.layout.title.text.startswith(f"{sum(lens)} tokens, {len(lens)} sequences")
    with pytest.raises(PacksimError, match="positive"):
        tile_map([3, 0])
    with pytest.raises(PacksimError, match="tile"):
        tile_map(tile=0)


@pytest.mark.parametrize("lengths,tile", [([100, 300, 28, 340, 256], 128), ([30, 50, 21], 16)])
def test_tile_map_axes_span_exactly_the_tokens(lengths, tile):
    N, n = sum(lengths), -(-sum(lengths) // tile)
    fig = tile_figure(lengths, tile=tile)
    for x, y in (("xaxis", "yaxis"), ("xaxis2", "yaxis2")):
        xa, ya = fig.layout[x], fig.layout[y]
        assert tuple(xa.range) == (0, N) and tuple(ya.range) == (N, 0)
        # a square panel shrinks its domain instead of widening the range past 0..N
        assert xa.constrain == ya.constrain == "domain" and ya.scaleanchor == x.replace("axis", "")
    (heat,) = [t for t in fig.data if t.type == "heatmap"]
    assert len(heat.x) == n + 1 and heat.x[0] == 0 and heat.x[-1] == N  # tile edges, not centres
    assert tuple(heat.y) == tuple(heat.x)


def test_tile_map_without_causal_has_no_causal_kernel_row():
    t = tile_map([40, 20], tile=16)
    assert "causal kernel over the whole pack" in t.numbers.value
    t.causal.value = False
    assert "causal kernel" not in t.numbers.value and "not causal" in t.numbers.value
    fig = shown_figure(t.out)
    assert "not causal" in fig["layout"]["title"]["text"]
    w = attention_work(as_cu_seqlens([40, 20]), causal=False, tile=16)
    assert f"{w.varlen_pairs:,}" in t.numbers.value and w.varlen_pairs == 40 * 40 + 20 * 20
    (varlen,) = [d for d in fig["data"] if d.get("fill") == "toself"]
    xs, ys = varlen["x"], varlen["y"]
    above = [(x, y) for x, y in zip(xs, ys, strict=True) if x is not None and x > y + 16]
    assert above  # without causal, key tiles right of the diagonal are computed too


def test_every_widget_has_its_root_class_and_displays(capsys):
    from packsim.viz import curves, leakage_explorer, quiz

    ex = make_examples(3, seed=0)
    built = {
        "packsim-leakage": leakage_explorer(ex, capacity=48),
        "packsim-curves": curves(),
        "packsim-playground": packing_playground(n=10, capacity=64),
        "packsim-mask-explorer": mask_explorer(ex, capacity=48),
        "packsim-labels": label_viewer(ex, capacity=48),
        "packsim-tiles": tile_map([10, 5], tile=4),
        "packsim-quiz": quiz(),
        "packsim-traps": trap_explorer(),
    }
    for css, w in built.items():
        assert css in w.widget._dom_classes, css
        w._ipython_display_()  # without a front end IPython prints the widget's repr
        assert w.figure().to_dict()["data"] or css == "packsim-curves"
        w.close()
        assert w.widget.comm is None  # closed
    assert "VBox" in capsys.readouterr().out


def test_tile_figure_draws_every_boundary_on_both_views():
    from packsim.viz import tile_figure

    fig = tile_figure([30, 50, 20], tile=16)
    dotted = [t for t in fig.data if t.type == "scatter" and t.line.dash == "dot"]
    assert len(dotted) == 2  # one per view
    for t in dotted:
        verticals = {x for x, y in zip(t.x, t.y, strict=True) if x is not None and y == 0}
        assert verticals == {30, 80}


def test_packing_figure_draws_every_piece_once_and_hatches_only_cut_ones_with_scalar_colours():
    """Each piece is one bar (ground truth: the wrapped packs cut here by hand); a cut piece is hatched
    in a trace of one colour (plotly.js warns on a hatch over an array marker.color), whole ones not."""
    from packsim.viz.style import chip_text, example_colour

    lengths, capacity = [30, 50, 70, 20, 90], 100  # wrapped: [30, 50, 20 of 70], [50 of 70, 20, 30 of 90], [60 of 90]
    fig = packing_figure(lengths, capacity, strategy="wrapped")
    bars = [(x, y, t) for tr in fig.data if tr.type == "bar" for x, y, t in zip(tr.x, tr.y, tr.hovertext, strict=True)]
    assert sorted((x, y) for x, y, _ in bars) == sorted([(0, 30), (0, 50), (0, 20), (1, 50), (1, 20), (1, 30), (2, 60)])
    cut = {(x, y) for x, y, t in bars if t.endswith("(cut)")}
    assert cut == {(0, 20), (1, 50), (1, 30), (2, 60)}
    for tr in (t for t in fig.data if t.type == "bar"):
        hatched = tr.marker.pattern.shape is not None
        assert hatched == all(t.endswith("(cut)") for t in tr.hovertext)
        if hatched:
            colour = tr.marker.color
            assert isinstance(colour, str) and tr.marker.pattern.bgcolor == colour
            assert tr.marker.pattern.fgcolor == chip_text(colour)
    example_of = {t: int(t.split(":")[0].split()[1]) for _, _, t in bars}
    for tr in (t for t in fig.data if t.type == "bar"):  # every bar in its example's colour
        colours = [tr.marker.color] * len(tr.x) if isinstance(tr.marker.color, str) else list(tr.marker.color)
        assert colours == [example_colour(example_of[t]) for t in tr.hovertext]
