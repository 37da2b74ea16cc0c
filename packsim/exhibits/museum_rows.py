"""The museum's table: one row per bug, what caught it and whether its fix passes.

Every room of the museum prints through it: the audited exhibits (:mod:`packsim.exhibits.museum`),
the pieces beyond SFT (:mod:`packsim.exhibits.museum_beyond_sft`) and the pieces at scale
(:mod:`packsim.exhibits.museum_at_scale`). It lives apart from them so each can build a table and
``museum.EXHIBITS`` can hold the pieces without an import cycle.

Lessons: none directly (museum_table, museum_beyond_sft_table and museum_at_scale_table return it; appendix A6 prints them).
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from packsim.core.text_table import markdown_table

__all__ = ["MuseumTable"]


@dataclass
class MuseumTable:
    """One row per exhibit: (name, bug, link, what caught it, fixed passes)."""

    rows: list[tuple[str, str, str, str, bool]]

    def to_markdown(self) -> str:
        return markdown_table(("bug", "link", "caught by", "fixed version passes"),
                              [(bug, link, caught, "yes" if ok else "NO") for _, bug, link, caught, ok in self.rows],
                              pad=False)

    def __str__(self) -> str:
        return self.to_markdown()

    def _repr_html_(self) -> str:
        body = "".join(f"<tr><td>{html.escape(bug)}</td><td><a href='{link}'>{html.escape(link)}</a></td>"
                       f"<td>{html.escape(caught)}</td><td>{'yes' if ok else 'NO'}</td></tr>"
                       for _, bug, link, caught, ok in self.rows)
        return ("<table><tr><th>bug</th><th>link</th><th>caught by</th><th>fixed passes</th></tr>"
                f"{body}</table>")
