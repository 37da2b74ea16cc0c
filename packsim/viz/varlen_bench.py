"""Dense N x N mask vs per-example attention, as measured in lesson 08: time and memory per pack length.

``bench`` is what the lesson's timing loop fills: ``{(path, N): {"times": [s, ...], "mem": MiB or
None}}`` for each ``path`` (``"dense"``, ``"blocked"``) and pack length ``N``; ``times`` are the
seconds of one forward + backward each, ``mem`` the peak resident-memory rise (None off Linux).

Lessons: A7.
"""

from __future__ import annotations

from statistics import median_high

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from packsim.core.errors import PacksimError
from packsim.viz.style import LEAK_RED, NO_LEAK, layout

__all__ = ["varlen_bench_figure", "PATH_STYLES"]

PATH_STYLES = {"dense": dict(color=LEAK_RED, dash="dash"), "blocked": dict(color=NO_LEAK, dash="solid")}


def varlen_bench_figure(bench: dict, sizes, paths=("dense", "blocked")) -> go.Figure:
    """Two panels over the pack length N (log x): median time per fwd+bwd (log y), peak memory rise.

    The median is the upper median (``sorted(times)[len(times) // 2]``), as the lesson's table.
    """
    sizes = list(sizes)
    missing = [(p, n) for p in paths for n in sizes if (p, n) not in bench or not bench[p, n].get("times")]
    if not sizes or missing:
        raise PacksimError(
            f"bench has no timings for {missing or 'any size'}: fill bench[(path, N)] = "
            "{'times': [...], 'mem': MiB} for every path and size first."
        )
    fig = make_subplots(rows=1, cols=2, subplot_titles=("time per fwd+bwd (s)", "peak memory rise (MiB)"))
    for p in paths:
        style = PATH_STYLES.get(p, {})
        times = [median_high(bench[p, n]["times"]) for n in sizes]
        mems = [bench[p, n].get("mem") for n in sizes]
        fig.add_trace(go.Scatter(x=sizes, y=times, name=p, legendgroup=p, line=style), row=1, col=1)
        fig.add_trace(go.Scatter(x=sizes, y=mems, name=p, legendgroup=p, showlegend=False, line=style),
                      row=1, col=2)  # fmt: skip
    fig.update_xaxes(type="log", title_text="pack length N (tokens)")
    fig.update_yaxes(type="log", row=1, col=1)  # memory stays linear: small sizes can rise by 0
    return layout(fig, "measured here: dense N x N mask vs per-example (blocked)", 380, below="legend")
