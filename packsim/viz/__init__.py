"""Interactive widgets and static figures for the course notebooks (ipywidgets + plotly).

Each widget constructor returns an object with ``.widget`` (the root ipywidgets box, CSS class
``packsim-<widget>``) that displays itself when it is the last expression of a cell, and a
``.figure()`` for the current view; each ``*_figure`` function returns a plotly ``go.Figure``
for HTML export and front ends without a kernel.

=====================================  ==========================  ========
widget                                 static figure               notebook
=====================================  ==========================  ========
:func:`packing_playground`             :func:`packing_figure`      01
:func:`leakage_explorer`               :func:`leakage_figure`      02 06 07
:func:`mask_explorer`                  :func:`mask_figure`         03
:func:`trap_explorer`                  :func:`trap_figure`         04
:func:`label_viewer`                   :func:`labels_figure`       05
:func:`curves` (``.callback`` live)    :func:`curves_figure`       06
:func:`tile_map`                       :func:`tile_figure`         08
:func:`quiz` (:func:`load_quizzes`)    :func:`quiz_figure`         09
=====================================  ==========================  ========

Shared pieces: :mod:`packsim.viz.style` (colours, the offline plotly config, layout helpers) and
:mod:`packsim.viz.widget` (the widget base class, figures in ``Output`` widgets). Importing this
package changes nothing global and loads no widget: each name loads its module on first use.
:func:`use_figure_config` puts the offline figure config (no vendor logo, no cloud upload button)
on every plotly.io renderer, so a plain ``fig.show()`` follows it too; each lesson calls it in its
first cell.

Lessons: 01, 02, 04.
"""

import importlib

# public name -> the module that defines it (imported on first access, PEP 562)
_HOMES = {
    "curves": "packsim.viz.training",
    "curves_figure": "packsim.viz.training",
    "label_viewer": "packsim.viz.labels",
    "labels_figure": "packsim.viz.labels",
    "leakage_explorer": "packsim.viz.leakage",
    "leakage_figure": "packsim.viz.leakage_heatmap",
    "load_quizzes": "packsim.viz.quiz_data",
    "mask_explorer": "packsim.viz.masks",
    "mask_figure": "packsim.viz.masks",
    "packing_figure": "packsim.viz.packing",
    "packing_playground": "packsim.viz.packing",
    "quiz": "packsim.viz.quizzes",
    "quiz_figure": "packsim.viz.quizzes",
    "tile_figure": "packsim.viz.tiles",
    "tile_map": "packsim.viz.tiles",
    "trap_explorer": "packsim.viz.traps",
    "trap_figure": "packsim.viz.traps",
    "use_figure_config": "packsim.viz.style",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'packsim.viz' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
