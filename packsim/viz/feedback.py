"""A check's verdict box in a notebook: ``Feedback._repr_html_`` (packsim.course.exercises) renders here.

The box shows outside any widget, so the widgets' CSS may not be on the page: its template
(``frontend/feedback.html``) carries its own style element, which sets the verdict colours of the
widgets (:data:`packsim.viz.style.OK_TEXT` / :data:`BAD_TEXT`) per theme: the light values, and
the dark ones under JupyterLab's dark theme (``body[data-jp-theme-light="false"]``) or VS Code's.
"Not done yet" takes the theme's own secondary text colour; a mark says the status without colour.
No tensors.

Lessons: none directly (every lesson's checks show it).
"""

from __future__ import annotations

from packsim.viz.assets import template
from packsim.viz.style import BAD_TEXT, OK_TEXT

__all__ = ["feedback_html"]

_COLOUR = {"correct": "var(--packsim-fb-ok)", "wrong": "var(--packsim-fb-bad)"}
_MARK = {"correct": "&#10004;", "wrong": "&#10008;"}


def feedback_html(status: str, head: str, message: str, hint: str) -> str:
    """The box for ``status`` ("correct", "wrong" or "not done yet"); ``head``, ``message`` and
    ``hint`` are HTML already escaped by the caller."""
    colour = _COLOUR.get(status, "var(--jp-ui-font-color2, #757575)")
    return template("feedback.html").substitute(
        ok_light=OK_TEXT["light"], ok_dark=OK_TEXT["dark"], bad_light=BAD_TEXT["light"],
        bad_dark=BAD_TEXT["dark"], status_class=status.replace(" ", "-"), colour=colour,
        mark=_MARK.get(status, "&#9998;"), status=status, head=head, message=message, hint=hint)
