"""Interactive widgets and static figures for the course notebooks (ipywidgets + plotly).

Each widget constructor returns an object with ``.widget`` (the root ipywidgets box, CSS class
``packsim-<widget>``) that displays itself as a cell's last expression, and ``.figure()`` for the
current view; each ``*_figure`` function returns a plotly ``go.Figure``. Widgets and their static
figures, by lesson: :func:`packing_playground` / :func:`packing_figure` (01),
:func:`leakage_explorer` / :func:`leakage_figure` (02 06 07), :func:`mask_explorer` /
:func:`mask_figure` (03), :func:`trap_explorer` / :func:`trap_figure` (04), :func:`label_viewer`
/ :func:`labels_figure` (05), :func:`curves` / :func:`curves_figure` (06), :func:`tile_map` /
:func:`tile_figure` (08), :func:`quiz` / :func:`quiz_figure` (09), :func:`token_weights_explorer`
and the figures of :mod:`packsim.viz.scaling` (10); lesson figures: :func:`allowed_pairs_figure`,
:func:`outside_share_figure`, :func:`reported_loss_figure` (02), :func:`varlen_bench_figure` (08).
Importing this package changes nothing global and loads no widget (each name loads its module on
first use); :func:`use_figure_config` sets the offline plotly config, once per lesson.

The names need the ``course`` extra (plotly and ipywidgets; pyyaml for :func:`load_quizzes`):
without it, using one raises one :class:`~packsim.PacksimError` line, ``packsim.viz.<name> needs
the course extra (...): pip install "packsim[course]"`` (:mod:`packsim.core.extras`). The package
itself imports without it, so :mod:`packsim.viz.comparison_report`'s tables serve ``packsim compare`` anywhere.

Lessons: 01, 02, 03, 04, 05, 06, 07, 08, 10, A1, A2, A3, A4, A5, A6, A7.
"""

from packsim.core.extras import require
from packsim.core.lazy import lazy_names

# public name -> the module that defines it (imported on first access, PEP 562)
_HOMES = {
    "curves": "packsim.viz.training",
    "card_table": "packsim.viz.comparison_report",
    "final_rows": "packsim.viz.comparison_report",
    "allowed_pairs_figure": "packsim.viz.masks",
    "curves_figure": "packsim.viz.training",
    "label_viewer": "packsim.viz.labels",
    "labels_figure": "packsim.viz.labels",
    "leakage_explorer": "packsim.viz.leakage",
    "leakage_figure": "packsim.viz.leakage_heatmap",
    "load_quizzes": "packsim.viz.quiz_data",
    "mask_explorer": "packsim.viz.masks",
    "mask_figure": "packsim.viz.masks",
    "outside_share_figure": "packsim.viz.leakage_heatmap",
    "packing_figure": "packsim.viz.packing",
    "packing_playground": "packsim.viz.packing",
    "quiz": "packsim.viz.quizzes",
    "quiz_figure": "packsim.viz.quizzes",
    "reported_loss_figure": "packsim.viz.training",
    "rank_loads_figure": "packsim.viz.scaling",
    "ranks_vs_one_figure": "packsim.viz.scaling",
    "tile_figure": "packsim.viz.tiles",
    "tile_map": "packsim.viz.tiles",
    "token_weights_explorer": "packsim.viz.scaling",
    "token_weights_figure": "packsim.viz.scaling",
    "trap_explorer": "packsim.viz.traps",
    "trap_figure": "packsim.viz.traps",
    "use_figure_config": "packsim.viz.style",
    "varlen_bench_figure": "packsim.viz.varlen_bench",
}

__all__ = sorted(_HOMES)


# what a home module imports from the course extra (the rest: plotly and ipywidgets, via widget.py)
_NEEDS = {
    "packsim.viz.comparison_report": (),  # its tables need no plotly (packsim compare prints them anywhere)
    "packsim.viz.quiz_data": ("yaml",),
    "packsim.viz.style": ("plotly",),
    "packsim.viz.varlen_bench": ("plotly",),
}
_WIDGETS = ("plotly", "ipywidgets")

_load, __dir__ = lazy_names(__name__, _HOMES, globals())


def __getattr__(name: str):
    """Load a public name from its module, after checking the course extra is installed."""
    if name in _HOMES:
        require(f"packsim.viz.{name}", "course", *_NEEDS.get(_HOMES[name], _WIDGETS))
    return _load(name)
