"""The comparison report: tables and plotly figures from a :class:`~packsim.experiment.results.Results`.

``packsim compare`` writes ``report.html`` with :func:`write_report`: one self-contained file
(plotly.js embedded, works offline) with the curves side by side, the final table (mean and
spread over seeds), the buggy-vs-correct table of the course card filled with measured numbers,
and the throughput on the long-tailed mix. Notebook 06 shows the same figures. The page's markup
and CSS are the ``report*`` files of ``packsim/viz/frontend/`` (:mod:`packsim.viz.assets`).

The tables (:func:`summary_table`, :func:`final_rows`, :func:`card_table`) need no plotly, so
``packsim compare`` prints its summary on a machine without it; the figures and
:func:`write_report` import plotly (and :mod:`packsim.viz`) when called.

Lessons: 06, 09, A5.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING

from packsim.experiment.results import Results, spread
from packsim.viz.assets import template

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = ["curves_figure", "copies_figure", "final_rows", "summary_table", "card_table", "write_report"]

# (column title, final key, format)
FINAL_COLUMNS = (
    ("isolated exact match", "isolated_exact_match", "{:.3f}"),
    ("isolated response loss", "isolated_response_loss", "{:.3f}"),
    ("loss the trainer reports", "reported_loss", "{:.3f}"),
    ("in-pack exact match", "packed_exact_match", "{:.3f}"),
    ("held-out template exact match", "heldout_exact_match", "{:.3f}"),
    ("attention outside own example", "outside_attention_share", "{:.1%}"),
    ("real tokens/s", "real_tokens_per_s", "{:,.0f}"),
)


def curves_figure(results: Results, data: str | None = None) -> go.Figure:
    """The curves widget's static figure (:func:`packsim.viz.curves_figure`) for one data design."""
    from packsim.viz.training import curves_figure as viz_curves_figure

    return viz_curves_figure([r for r in results.runs if data is None or r.data == data])


def copies_figure(results: Results, data: str | None = "facts") -> go.Figure | None:
    """In-pack response loss of first vs repeated copies per setup (facts design), or None.

    Lines are means over seeds, bands their min-max. A gap between the panels is copying.
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from packsim.viz.style import layout, setup_colour
    from packsim.viz.training import seed_spread

    groups = results.by_setup(data)
    if not any("response_loss_repeat" in r.curves.get("train", {}) for rs in groups.values() for r in rs):
        return None
    fig = make_subplots(rows=1, cols=2, subplot_titles=("first copy (in pack)", "repeated copy (in pack)"))
    for setup, runs in groups.items():
        colour = setup_colour(setup, list(groups))
        for col, key in ((1, "response_loss_first"), (2, "response_loss_repeat")):
            steps, mean, low, high = seed_spread(runs, "train", key)
            if len(runs) > 1:
                fig.add_trace(go.Scatter(x=steps + steps[::-1], y=high + low[::-1], fill="toself",
                                         line=dict(width=0), fillcolor=colour, opacity=0.2,
                                         hoverinfo="skip", showlegend=False), row=1, col=col)
            fig.add_trace(go.Scatter(x=steps, y=mean, name=setup, legendgroup=setup, showlegend=col == 1,
                                     line=dict(color=colour, width=2)), row=1, col=col)
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text="response loss")
    return layout(fig, "", 380, below="legend")


def _cell(values: list[float], fmt: str) -> str:
    s = spread(values)
    if s["n"] == 0:
        return "-"
    if s["n"] == 1:
        return fmt.format(s["mean"])
    return f"{fmt.format(s['mean'])} [{fmt.format(s['min'])}, {fmt.format(s['max'])}]"


def final_rows(results: Results, data: str | None = None) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the final table: mean [min, max] over seeds per setup."""
    groups = results.by_setup(data)
    cols = [c for c in FINAL_COLUMNS if any(c[1] in r.final for rs in groups.values() for r in rs)]
    header = ["setup", "seeds", *[c[0] for c in cols]]
    rows = []
    for setup, runs in groups.items():
        cells = [_cell([r.final[k] for r in runs if r.final.get(k) is not None], fmt) for _, k, fmt in cols]
        rows.append([setup, str(len(runs)), *cells])
    return header, rows


def _text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def summary_table(results: Results) -> str:
    """Plain-text final table (what the CLI prints last)."""
    parts = []
    for data in dict.fromkeys(r.data for r in results.runs):
        header, rows = final_rows(results, data)
        parts.append(f"[{data}] mean [min, max] over seeds\n" + _text_table(header, rows))
    if results.throughput:
        parts.append(_text_table(*_throughput_rows(results)))
    return "\n\n".join(parts)


def _mean(results: Results, setup: str, key: str) -> float | None:
    vals = [r.final[key] for r in results.by_setup().get(setup, []) if r.final.get(key) is not None]
    return spread(vals)["mean"] if vals else None


def card_table(results: Results) -> tuple[list[str], list[list[str]]] | None:
    """The course card's buggy-vs-correct table, filled with this comparison's numbers."""
    groups = results.by_setup()
    if "buggy" not in groups or "correct" not in groups:
        return None
    m = lambda s, k, f: "-" if _mean(results, s, k) is None else f.format(_mean(results, s, k))  # noqa: E731
    return ["", "buggy", "correct"], [
        ["attention mask", "causal over the whole pack", "block-diagonal: causal inside each example"],
        ["cross-example attention",
         f"yes: {m('buggy', 'outside_attention_share', '{:.1%}')} of attention lands on other examples",
         f"none: {m('correct', 'outside_attention_share', '{:.1%}')}"],
        ["loss target", "every token: prompt, padding, boundary", "response tokens and EOS only"],
        ["symptom",
         f"reported loss {m('buggy', 'reported_loss', '{:.3f}')} looks healthy; alone it gets "
         f"{m('buggy', 'isolated_exact_match', '{:.1%}')} exact match",
         f"reported loss {m('correct', 'reported_loss', '{:.3f}')}; alone "
         f"{m('correct', 'isolated_exact_match', '{:.1%}')} exact match"],
        ["throughput (this run, real tokens/s)", m("buggy", "real_tokens_per_s", "{:,.0f}"),
         m("correct", "real_tokens_per_s", "{:,.0f}")],
        ["implementation", "labels = input_ids; one causal mask; positions 0..P-1",
         "cu_seqlens / BlockMask / position_ids reset (attention_mask=None, use_cache=False); "
         "labels -100 outside responses"],
    ]


def _throughput_rows(results: Results) -> tuple[list[str], list[list[str]]]:
    tp = results.throughput
    base = tp.get("padded", {}).get("real_tokens_per_s")
    header = ["long-tailed mix", "real tokens/s", "all tokens/s", "fill", "vs padded"]
    rows = [[s, f"{v['real_tokens_per_s']:,.0f}", f"{v['padded_tokens_per_s']:,.0f}", f"{v['fill']:.1%}",
             f"{v['real_tokens_per_s'] / base:.2f}x" if base else "-"] for s, v in tp.items()]
    return header, rows


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    cell, row = template("report_cell.html").substitute, template("report_row.html").substitute
    th = "".join(cell(tag="th", text=html.escape(h)) for h in header)
    body = "".join(row(cells="".join(cell(tag="td", text=html.escape(c)) for c in r)) for r in rows)
    return template("report_table.html").substitute(head=th, body=body)


def _heading(text: str) -> str:
    return template("report_heading.html").substitute(text=text)


def write_report(results: Results, path: str | Path) -> Path:
    """Write the self-contained HTML report (plotly.js embedded once, no network needed)."""
    from packsim.viz.style import figure_config

    path = Path(path)
    setups = html.escape(", ".join(results.setups()))
    parts = [template("report_title.html").substitute(setups=setups), _meta(results)]
    card = card_table(results)
    if card:
        parts += [_heading("Buggy vs correct, measured"), _html_table(*card)]
    include = True
    for data in dict.fromkeys(r.data for r in results.runs):
        parts.append(_heading(f"Training curves ({html.escape(data)} data)"))
        parts.append(curves_figure(results, data).to_html(full_html=False, include_plotlyjs=include,
                                                          config=figure_config()))
        include = False
        parts += [_heading("Final metrics (mean [min, max] over seeds)"), _html_table(*final_rows(results, data))]
        copies = copies_figure(results, data)
        if copies is not None:
            parts += [_heading("Copying: in-pack loss of first vs repeated copies"),
                      copies.to_html(full_html=False, include_plotlyjs=include, config=figure_config())]
    if results.throughput:
        parts += [_heading("Throughput on the long-tailed mix (packed vs one example per row)"),
                  _html_table(*_throughput_rows(results))]
    doc = template("report.html").substitute(css=template("report.css").template, body="".join(parts))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc)
    return path


def _meta(results: Results) -> str:
    env, cfg = results.env, results.config
    tr = cfg.get("train", {})
    return template("report_meta.html").substitute(
        data=html.escape(cfg.get("data", "?")), mode=html.escape(cfg.get("mode", "?")),
        seeds=cfg.get("seeds"), steps=tr.get("steps"), examples=tr.get("examples_per_step"),
        capacity=tr.get("capacity"), strategy=html.escape(str(tr.get("strategy"))),
        device=html.escape(str(env.get("device"))), torch=html.escape(str(env.get("torch"))),
        transformers=html.escape(str(env.get("transformers"))),
        date=html.escape(str(env.get("date"))), wall_s=f"{results.wall_s:.0f}",
    )
