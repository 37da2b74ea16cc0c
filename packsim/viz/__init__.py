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
package sets the offline figure config (no vendor logo, no cloud upload button) on every plotly.io
renderer, so a plain ``fig.show()`` in a notebook follows it too.

Lessons: 01, 02, 04.
"""

from packsim.viz.labels import label_viewer, labels_figure
from packsim.viz.leakage import leakage_explorer
from packsim.viz.leakage_heatmap import leakage_figure
from packsim.viz.mask_view import mask_explorer, mask_figure
from packsim.viz.playground import packing_figure, packing_playground
from packsim.viz.quiz_data import load_quizzes
from packsim.viz.quizzes import quiz, quiz_figure
from packsim.viz.style import use_figure_config
from packsim.viz.tiles import tile_figure, tile_map
from packsim.viz.training_curves import curves, curves_figure
from packsim.viz.traps_view import trap_explorer, trap_figure

use_figure_config()

__all__ = [
    "curves",
    "curves_figure",
    "label_viewer",
    "labels_figure",
    "leakage_explorer",
    "leakage_figure",
    "load_quizzes",
    "mask_explorer",
    "mask_figure",
    "packing_figure",
    "packing_playground",
    "quiz",
    "quiz_figure",
    "tile_figure",
    "tile_map",
    "trap_explorer",
    "trap_figure",
]
