"""The audit's report: one ProbeResult per probe, the worst pair, causes, table and HTML.

Shapes: ``logit_change`` (S, S) max |logit change| of example j when example i is perturbed;
``gradient_ratio`` (S, S); ``attention_outside`` (L, H) share of attention outside the own example.
Used by lesson 06 and ``packsim audit``.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

import torch

PROBES = ("perturbation", "gradient", "attention_mass", "loss_coverage", "positions")


@dataclass
class ProbeResult:
    """One probe: ``status`` is ``"pass"``, ``"fail"`` or ``"skipped"`` (never counted as a pass).

    ``value`` is the probe's number (compared with ``threshold``); ``summary`` says in words what
    it measured; ``details`` holds the raw evidence (counts, per-layer numbers).
    """

    name: str
    status: str
    value: float | None
    threshold: float | None
    summary: str
    details: dict = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status == "fail"


@dataclass(frozen=True)
class WorstPair:
    """The pair of examples with the largest cross-example effect (ids as the report shows them)."""

    perturbed: int
    affected: int
    logit_change: float
    gradient_ratio: float | None

    def __str__(self) -> str:
        grad = "" if self.gradient_ratio is None else f", gradient ratio {self.gradient_ratio:.2e}"
        return (f"changing example {self.perturbed} moves example {self.affected}'s logits by "
                f"{self.logit_change:.3g}{grad}")


@dataclass
class AuditReport:
    """What :func:`audit` found. ``ok`` / ``failed`` make it usable as a CI gate.

    Attributes:
        probes: name -> :class:`ProbeResult`, in :data:`PROBES` order;
        boundaries: where the example boundaries came from (e.g. ``"cu_seq_lens_q"``);
        example_ids: the examples' ids as shown in the report (S,);
        logit_change: (S, S) float, ``[i, j]`` = max |change| of example j's logits when example
            i is perturbed (NaN for rows not perturbed);
        gradient_ratio: (S, S) float, ``[i, j]`` = max |d loss_j / d emb_i| / max |d loss_j / d emb_j|
            (NaN where not computed), or None when the probe was skipped;
        attention_outside: (L, H) float, per layer and head the largest share of one query's
            attention outside its example, or None when skipped;
        worst_pair, causes (plain-language likely causes and fixes), forward (what was run),
        seconds (wall time of the audit).
    """

    probes: dict[str, ProbeResult]
    boundaries: str
    example_ids: list[int]
    forward: str
    logit_change: torch.Tensor
    gradient_ratio: torch.Tensor | None
    attention_outside: torch.Tensor | None
    worst_pair: WorstPair | None
    causes: list[str]
    seconds: float

    @property
    def failed(self) -> list[str]:
        """Names of the failed probes, in :data:`PROBES` order."""
        return [name for name, p in self.probes.items() if p.failed]

    @property
    def skipped(self) -> list[str]:
        return [name for name, p in self.probes.items() if p.status == "skipped"]

    @property
    def ok(self) -> bool:
        """True when no probe failed (skipped probes are listed in the verdict, not failures)."""
        return not self.failed

    @property
    def verdict(self) -> str:
        """One line: PASS/FAIL, the failed probes, and the first likely cause."""
        skipped = f"; skipped: {', '.join(self.skipped)}" if self.skipped else ""
        n = len(self.example_ids)
        if self.ok:
            return f"PASS: {n} examples isolated and the loss counts only responses{skipped}."
        leak = self.probes["perturbation"].failed and self.worst_pair is not None
        lead = f" {self.worst_pair}." if leak else ""
        lead += f" {self.causes[0]}" if self.causes else ""
        return f"FAIL ({', '.join(self.failed)}):{lead}{skipped}"

    def rows(self) -> list[tuple[str, str, str, str, str]]:
        """Table rows: (probe, result, value, threshold, evidence)."""
        out = []
        for p in self.probes.values():
            value = "-" if p.value is None else f"{p.value:.3g}"
            thr = "-" if p.threshold is None else f"{p.threshold:.0e}" if p.threshold else "0"
            out.append((p.name, p.status.upper(), value, thr, p.summary))
        return out

    def table(self) -> str:
        """The report as plain text: verdict, where boundaries came from, the probe table, causes."""
        head = ("probe", "result", "value", "threshold", "evidence")
        rows = [head, *self.rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = [self.verdict,
                 f"examples: {len(self.example_ids)}; boundaries from {self.boundaries}; "
                 f"forward: {self.forward}; audit took {self.seconds:.2f} s"]
        for r in rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4])
        if self.worst_pair is not None:
            lines.append(f"worst pair: {self.worst_pair}")
        lines += [f"likely cause: {c}" for c in self.causes]
        return "\n".join(lines)

    def to_html(self) -> str:
        """The same report as an HTML table (notebooks show it through ``_repr_html_``)."""
        color = {"PASS": "#1a7f37", "FAIL": "#cf222e", "SKIPPED": "#9a6700"}
        cells = "".join(
            f"<tr><td><code>{n}</code></td><td style='color:{color[s]};font-weight:bold'>{s}</td>"
            f"<td>{v}</td><td>{t}</td><td style='text-align:left'>{html.escape(e)}</td></tr>"
            for n, s, v, t, e in self.rows()
        )
        extra = [f"worst pair: {self.worst_pair}"] if self.worst_pair is not None else []
        extra += [f"likely cause: {c}" for c in self.causes]
        notes = "".join(f"<li>{html.escape(x)}</li>" for x in extra)
        return (
            f"<div class='packsim-audit'><p><b>{html.escape(self.verdict)}</b></p>"
            f"<p>{len(self.example_ids)} examples; boundaries from {html.escape(self.boundaries)}; "
            f"forward: <code>{html.escape(self.forward)}</code>; {self.seconds:.2f} s</p>"
            "<table><tr><th>probe</th><th>result</th><th>value</th><th>threshold</th>"
            f"<th>evidence</th></tr>{cells}</table><ul>{notes}</ul></div>"
        )

    def _repr_html_(self) -> str:
        return self.to_html()

    def __str__(self) -> str:
        return self.table()


