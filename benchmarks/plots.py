"""Plots of the benchmark results (plotly), saved as PNG for RESULTS.md.

Reads ``packing.json``, ``attention.json``, ``throughput.json`` (and ``gpu.json`` when present)
from a results folder and writes ``packing.png``, ``attention.png``, ``throughput.png`` (and
``gpu.png``) next to them. PNGs are rendered offline by the system Chromium through playwright
(plotly.js is embedded in the page, nothing is downloaded); when that is not possible, one
self-contained ``plots.html`` is written instead.

    python benchmarks/plots.py                         # benchmarks/results
    python benchmarks/plots.py --dir runs/bench-quick  # after make bench-quick
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import benchutil as bu
import plotly.graph_objects as go
from plotly.subplots import make_subplots

COLORS = {"wrapped": "#9e9e9e", "ffd": "#64b5f6", "bfd": "#1565c0", "bfd_split": "#0d47a1",
          "trl_bfd": "#e65100", "trl_bfd_1batch": "#ffb74d", "trl_bfd_split": "#bf360c",
          "trl_bfd_split_1batch": "#ffcc80", "trl_wrapped": "#6d4c41", "trl_wrapped_1batch": "#bcaaa4",
          "dense": "#c62828", "sdpa_dense": "#c62828", "blocked": "#1565c0", "flex": "#2e7d32",
          "causal": "#9e9e9e", "flash": "#6a1b9a", "torch_varlen": "#00838f",
          "padded": "#9e9e9e", "packed": "#1565c0"}


def _err(s: dict, scale: float = 1.0) -> dict:
    """plotly asymmetric error bars from a summarize() dict."""
    return dict(type="data", symmetric=False, array=[(s["max"] - s["median"]) * scale],
                arrayminus=[(s["median"] - s["min"]) * scale])


def _line(name, xs, summaries, scale=1.0, dash=None):
    """One line with min-max error bars; ``summaries`` are summarize() dicts."""
    return go.Scatter(
        x=xs, y=[s["median"] * scale for s in summaries], name=name, mode="lines+markers",
        line=dict(color=COLORS.get(name), dash=dash),
        error_y=dict(type="data", symmetric=False,
                     array=[(s["max"] - s["median"]) * scale for s in summaries],
                     arrayminus=[(s["median"] - s["min"]) * scale for s in summaries]),
    )


def packing_figure(data: dict) -> go.Figure:
    """Time vs n at the smallest capacity (every packer runs there), packsim/TRL time ratios at
    the largest n per capacity (below 1: packsim faster), and the gap to the lower bound."""
    rows = [r for r in data["rows"] if r["mix"] == "long_tailed"]
    caps = sorted({r["capacity"] for r in rows})
    big = max(r["n"] for r in rows)
    packers = list(dict.fromkeys(r["packer"] for r in rows))
    fig = make_subplots(rows=1, cols=3, column_widths=[0.4, 0.35, 0.25], horizontal_spacing=0.08,
                        subplot_titles=(f"time vs n, capacity {caps[0]}", f"packsim / TRL time, n={big:,}",
                                        f"gap to the lower bound, n={big:,}"))
    fig.update_layout(title=dict(text=(
        "long-tailed mix. Middle: bars per packsim packer (colour) vs TRL as SFTTrainer calls it "
        "(solid) and in one batch (pale); below the dotted line packsim is faster"), font=dict(size=12)))
    for p in packers:
        pts = sorted((r["n"], r["time_s"]) for r in rows if r["packer"] == p and r["capacity"] == caps[0])
        fig.add_trace(_line(p, [n for n, _ in pts], [s for _, s in pts]), 1, 1)
        gaps = [(r["capacity"], r["gap"] * 100) for r in rows if r["packer"] == p and r["n"] == big]
        fig.add_trace(go.Bar(x=[str(c) for c, _ in gaps], y=[g for _, g in gaps], name=p,
                             marker_color=COLORS.get(p), showlegend=False), 1, 3)
    for r in (r for r in rows if r["n"] == big and r.get("ratio_vs")):
        for t, ratio in r["ratio_vs"].items():
            fig.add_trace(go.Bar(
                x=[str(r["capacity"])],
                y=[ratio["median"]], name=f"{r['packer']} / {t}", showlegend=False,
                marker_color=COLORS.get(r["packer"]), opacity=0.45 if t.endswith("_1batch") else 1.0,
                error_y=_err(ratio), hovertext=f"{r['packer']} / {t}"), 1, 2)
    fig.add_hline(y=1.0, line_dash="dot", line_color="#444", row=1, col=2)
    fig.update_xaxes(type="log", title_text="lengths packed (n)", row=1, col=1)
    fig.update_yaxes(type="log", title_text="seconds (median, min-max)", row=1, col=1)
    fig.update_xaxes(title_text="capacity", row=1, col=2)
    fig.update_yaxes(type="log", title_text="packsim time / TRL time", row=1, col=2)
    fig.update_xaxes(title_text="capacity", row=1, col=3)
    fig.update_yaxes(title_text="packs / lower bound - 1 (%)", row=1, col=3)
    fig.update_layout(barmode="group")
    return fig


def attention_figure(data: dict) -> go.Figure:
    rows = [r for r in data["rows"] if "fwd_s" in r]
    fig = make_subplots(rows=1, cols=2, subplot_titles=(
        "time vs pack length (fwd+bwd; flex: fwd only)", "peak memory of one call vs pack length"))
    for p in dict.fromkeys(r["path"] for r in rows):
        pts = sorted((r["n"], r) for r in rows if r["path"] == p)
        key = "fwd_bwd_s" if pts[0][1].get("fwd_bwd_times") else "fwd_s"
        fig.add_trace(_line(p, [n for n, _ in pts], [r[key] for _, r in pts],
                            dash=None if key == "fwd_bwd_s" else "dot"), 1, 1)
        mem = [(n, r["peak_mb"]) for n, r in pts if r.get("peak_mb", {}).get("n")]
        fig.add_trace(go.Scatter(x=[n for n, _ in mem], y=[max(m["median"], 0.1) for _, m in mem], name=p,
                                 mode="lines+markers", line=dict(color=COLORS.get(p)), showlegend=False), 1, 2)
    for c in (1, 2):
        fig.update_xaxes(type="log", title_text="tokens in the pack (N)", row=1, col=c)
    fig.update_yaxes(type="log", title_text="seconds (median, min-max)", row=1, col=1)
    fig.update_yaxes(type="log", title_text="MiB above the RSS before the call", row=1, col=2)
    return fig


def throughput_figure(data: dict) -> go.Figure:
    s = data["summary"]
    fig = go.Figure()
    for m in ("padded", "packed"):
        st = s[m]["step_real_tokens_per_s"]
        fig.add_trace(go.Bar(x=[m], y=[st["median"]], name=m, marker_color=COLORS[m], error_y=_err(st)))
    fig.update_layout(title=f"real tokens/s per step (median, min-max): packed / padded "
                            f"{s['ratio']['median']:.2f}x per step, {s['ratio_overall']:.2f}x overall",
                      yaxis_title="real (non-pad) tokens / s",
                      showlegend=False)
    return fig


def gpu_figure(data: dict) -> go.Figure:
    rows = [r for r in data["attention"] if r.get("fwd_bwd_s")]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("bf16 fwd+bwd time vs N", "peak memory vs N"))
    for p in dict.fromkeys(r["path"] for r in rows):
        pts = sorted((r["n"], r) for r in rows if r["path"] == p)
        fig.add_trace(_line(p, [n for n, _ in pts], [r["fwd_bwd_s"] for _, r in pts], scale=1e3), 1, 1)
        fig.add_trace(go.Scatter(x=[n for n, _ in pts], y=[r["peak_gib"] for _, r in pts], name=p,
                                 mode="lines+markers", line=dict(color=COLORS.get(p)), showlegend=False), 1, 2)
    for c in (1, 2):
        fig.update_xaxes(type="log", title_text="tokens in the pack (N)", row=1, col=c)
    fig.update_yaxes(type="log", title_text="ms", row=1, col=1)
    fig.update_yaxes(type="log", title_text="GiB", row=1, col=2)
    return fig


FIGURES = {"packing": packing_figure, "attention": attention_figure, "throughput": throughput_figure,
           "gpu": gpu_figure}


def render_png(figs: dict[str, go.Figure], folder: Path, width: int = 1100, height: int = 450) -> list[Path]:
    """Screenshot each figure with the system Chromium (playwright, offline); [] if unavailable."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return []
    chromium = next((p for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser") if Path(p).exists()), None)
    flags = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run"]
    out = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=flags)
        page = browser.new_page(viewport={"width": width, "height": height})
        for name, fig in figs.items():
            fig.update_layout(width=width, height=height, template="plotly_white")
            page.set_content(fig.to_html(include_plotlyjs=True, full_html=True))
            page.wait_for_selector(".main-svg")
            path = folder / f"{name}.png"
            page.locator(".plotly-graph-div").screenshot(path=str(path))
            out.append(path)
        browser.close()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=str(bu.RESULTS_DIR), help="results folder (default benchmarks/results)")
    args = ap.parse_args(argv)
    folder = Path(args.dir)
    figs = {}
    for name, make in FIGURES.items():
        path = folder / f"{name}.json"
        if path.exists():
            figs[name] = make(json.loads(path.read_text()))
    if not figs:
        print(f"no benchmark JSON in {folder}: run the benchmarks first (make bench).")
        return 1
    try:
        written = render_png(figs, folder)
    except Exception as err:  # no browser, sandbox refusal...: fall back to HTML
        print(f"PNG rendering failed ({type(err).__name__}: {err}); writing plots.html instead")
        written = []
    if not written:
        html = folder / "plots.html"
        parts = [f.to_html(include_plotlyjs=(i == 0), full_html=False) for i, f in enumerate(figs.values())]
        html.write_text("<html><body>" + "\n".join(parts) + "</body></html>")
        written = [html]
    for p in written:
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
