"""The audit's report: one ProbeResult per probe, the worst pair, causes, table and HTML.

Shapes: ``logit_change`` (S, S) max |logit change| of example j when example i is perturbed;
``gradient_ratio`` (S, S); ``attention_outside`` (L, H) share of attention outside the own example.
Used by ``packsim audit``.

Lessons: none directly (packsim.audit returns an AuditReport).
"""

from __future__ import annotations

import html
import textwrap
from dataclasses import dataclass, field

import torch

from packsim.core.text_table import text_table

PROBES = ("perturbation", "gradient", "attention_mass", "loss_coverage", "positions")
WIDTH = 100  # columns of ``str(report)``; ``report.table()`` keeps one line per row


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
        i, j, r = self.perturbed, self.affected, self.gradient_ratio
        grad = ("" if r is None else
                f" (gradient ratio {_times(r)}: example {i}'s tokens move example {j}'s loss {_times(r)} times "
                f"as much as example {j}'s own tokens do, where isolated examples give 0: training on "
                f"example {j} teaches the model to read example {i} as its context)")
        return f"changing example {i} moves example {j}'s logits by {self.logit_change:.3g}{grad}"


def _times(r: float) -> str:
    """A ratio as a person reads it: 1,190 rather than 1.19e+03; 0.0012 stays 0.0012."""
    return f"{r:,.0f}" if r >= 100 else f"{r:.2g}"


FINDING_STATUSES = ("pass", "fail", "skipped", "notice")


@dataclass(frozen=True)
class Finding:
    """A configuration check of a training pipeline (:func:`packsim.audit_trainer`).

    ``status`` is ``"pass"``, ``"fail"``, ``"skipped"`` (could not be checked here, e.g. no GPU:
    never counted as a pass) or ``"notice"`` (the trainer did not honour a setting, but nothing it
    trains on is corrupted, e.g. DPO's padding fallback: printed beside a PASS, a failure only
    when the audit is asked to be strict); ``evidence`` says what was read or measured, ``fix``
    what to change.
    """

    name: str
    status: str
    evidence: str
    fix: str = ""

    def __post_init__(self):
        if self.status not in FINDING_STATUSES:
            raise ValueError(f"Finding.status must be one of {FINDING_STATUSES}, got {self.status!r}")

    @property
    def failed(self) -> bool:
        return self.status == "fail"


# How to get a probe the audit had to skip (printed under the table, with what a skip means).
HOW_TO_GET = {
    "perturbation": "audit a batch of 2+ examples through a forward that runs here; the evidence column "
                    "says what stopped it (one example in the batch, a forward that refused the batch, or "
                    "logits that did not change with input_ids)",
    "gradient": "audit where this forward has a backward pass (attn_implementation='eager' or "
                "'sdpa' on CPU, or a GPU)",
    "attention_mass": "load the model with attn_implementation='eager' (the transformers attention "
                      "that returns probabilities) and audit again; packsim's own models always give it",
    "loss_coverage": "audit a batch that carries labels",
    "positions": "audit a model whose forward takes position_ids",
}


# evidence.collect writes this when EOS tokens cut the rows into more pieces than the fields mark examples
UNTIED_PIECES = "pieces where the fields mark"


def rests_on_metadata(findings) -> bool:
    """True when the ``boundary_fields`` finding among ``findings`` says nothing independent located the
    examples and the batch carries boundary fields (a batch with none is one example per row: the rows
    are the layout, not a claim, unless EOS tokens cut a row into pieces nothing ties to examples). :class:`AuditReport` and :func:`packsim.audit_logprobs` both ask this."""
    fields = next((f for f in findings if f.name == "boundary_fields"), None)
    return fields is not None and fields.status == "skipped" and (
        "(no boundary field)" not in fields.evidence or UNTIED_PIECES in fields.evidence)


def _sentence(text: str) -> str:
    text = text.strip()
    return text if text.endswith((".", "!", "?")) else text + "."


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
        seconds (wall time of the audit);
        findings: configuration checks (:class:`Finding`), filled by :func:`packsim.audit_trainer`.

    Example::

        >>> import packsim
        >>> model, examples = packsim.build_model("tiny", seed=0), packsim.make_examples(4, seed=0)
        >>> report = packsim.audit(model, packsim.PackedBatch.from_examples(examples, capacity=64, setup="buggy"))
        >>> report.ok, report.status, "perturbation" in report.failed
        (False, 'fail', True)
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
    findings: list[Finding] = field(default_factory=list)
    trust_boundaries: bool = False  # the user says the batch's own boundary fields are the ground truth
    path_not_run: str = ""  # why the attention path the user launches did not run here ('' when it did)

    @property
    def failed(self) -> list[str]:
        """Names of the failed probes (in :data:`PROBES` order), then of the failed findings."""
        return ([name for name, p in self.probes.items() if p.failed]
                + [f.name for f in self.findings if f.failed])

    @property
    def skipped(self) -> list[str]:
        """Names of the probes, then the findings, that could not be checked (neither pass nor fail)."""
        return ([name for name, p in self.probes.items() if p.status == "skipped"]
                + [f.name for f in self.findings if f.status == "skipped"])

    @property
    def ok(self) -> bool:
        """True only for a pass (``status == "pass"``): nothing failed, isolation was measured on the
        path the pipeline runs and the verdict does not rest on the batch's own boundary fields alone.
        A notice beside a pass is a pass (``strict`` has made it a failure already); "not measured"
        and "unverified" are not, so ``ok``, ``status``, the exit code and the headline agree."""
        return self.status == "pass"

    @property
    def rests_on_metadata(self) -> bool:
        """True when nothing independent of the batch's boundary fields said where the examples are
        (no examples given, no BOS / EOS to locate them by): the fields were checked only against
        each other."""
        return rests_on_metadata(self.findings)

    @property
    def isolation_measured(self) -> bool:
        """True when the perturbation or the gradient probe ran (False: e.g. one example per batch)."""
        return any(self.probes[n].status != "skipped" for n in ("perturbation", "gradient") if n in self.probes)

    @property
    def status(self) -> str:
        """``"fail"`` (a probe or finding failed), ``"not measured"`` (nothing failed but isolation
        could not be measured: not a pass), ``"unverified"`` (isolated as the batch's own boundary
        fields mark them, with no independent evidence of where the examples are, and the user did
        not say the fields are the ground truth: not a pass) or ``"pass"``; ``packsim audit`` exits
        1, 3, 3 or 0."""
        if self.failed:
            return "fail"
        if not self.isolation_measured or self.path_not_run:
            return "not measured"
        return "unverified" if self.rests_on_metadata and not self.trust_boundaries else "pass"

    def _loss_claim(self) -> str:
        """What the verdict may say about the loss: only what the loss_coverage probe measured."""
        loss = self.probes.get("loss_coverage")
        if loss is not None and "not_measured" in loss.details:
            measured = loss.details.get("measured")
            return ("; which labels are prompt and which response was not measured (no prompt/response split "
                    "independent of the labels reached the audit: see loss_coverage for how to give it), so the "
                    "loss was not measured as completion-only; it was checked by value (padding, boundaries, EOS, "
                    f"each counted label its own token{'; ' + measured if measured else ''}).")
        if loss is None or loss.status == "skipped":
            return f"; the loss was not checked ({loss.summary if loss else 'no loss probe'})."
        if loss.details.get("objective") == "lm":
            return " and the loss counts every real token (the 'lm' objective), no padding or cross-boundary label."
        return " and the loss counts only responses."

    def _boundary_claim(self) -> str:
        """Whether the isolation verdict rests on independent boundaries or on the batch's own fields."""
        fields = next((f for f in self.findings if f.name == "boundary_fields"), None)
        if fields is None or fields.status != "skipped":
            return ""
        return (" as the batch's own boundary fields mark them (no independent evidence of where the "
                "examples are: the verdict rests on the batch's own metadata)")

    def _pass_head(self) -> str:
        """``PASS``, saying in its first words when the loss masking was not measured (a pass of isolation only)."""
        loss = self.probes.get("loss_coverage")
        if loss is None or loss.status != "skipped":
            return "PASS"
        if "not_measured" in loss.details:
            return "PASS (isolation; loss masking not measured: pass examples= / response_mask=)"
        return "PASS (isolation; loss not checked: audit a batch that carries labels)"

    @property
    def verdict(self) -> str:
        """One line: PASS/FAIL/NOT MEASURED/UNVERIFIED, what failed, the worst pair and the first likely
        cause, skips. It starts with ``PASS`` exactly when :attr:`ok`; a pass whose loss_coverage probe
        was skipped says so in its first words (``PASS (isolation; loss masking not measured: ...)``)."""
        n = len(self.example_ids)
        if not self.failed and self.path_not_run:
            line = (f"NOT MEASURED: the attention path this pipeline launches did not run here "
                    f"({self.path_not_run}); nothing failed, but what was measured is another path, so "
                    "this is not a pass.")
        elif not self.failed and not self.isolation_measured:
            why = ("the audited batch holds one example, so no other example can leak into it: audit batches "
                   "of 2+ examples, e.g. a larger per_device_train_batch_size or packing" if n < 2 else
                   self.probes["perturbation"].summary if "perturbation" in self.probes else "no probe ran")
            line = (f"NOT MEASURED: whether the {n} example(s) stay isolated could not be measured ({why}); "
                    "nothing failed, but this is not a pass.")
        elif self.status == "unverified":
            line = (f"UNVERIFIED: {n} examples isolated as the batch's own boundary fields mark them, but "
                    "nothing independent says where the examples are (no examples given, and no BOS / EOS "
                    "tokens that mark the same examples): the verdict rests on the batch's own metadata, where a wrong field "
                    "goes unseen, so this is not a pass. Pass examples= "
                    "(the collator's input), or trust_boundaries=True (--trust-boundaries) when the fields "
                    f"are the ground truth{self._loss_claim()}")
        elif self.ok:
            line = f"{self._pass_head()}: {n} examples isolated{self._boundary_claim()}{self._loss_claim()}"
        else:
            parts = [f"FAIL ({', '.join(self.failed)}):"]
            if self.probes["perturbation"].failed and self.worst_pair is not None:
                parts.append(_sentence(str(self.worst_pair)))
            first_fix = next((f.fix for f in self.findings if f.failed and f.fix), "")
            if self.causes or first_fix:
                parts.append(_sentence(self.causes[0] if self.causes else first_fix))
            line = " ".join(parts)
        if self.skipped:
            line += (f" Not measured (skipped: {', '.join(self.skipped)}): a skip is neither a pass "
                     "nor a fail.")
        return line

    def rows(self) -> list[tuple[str, str, str, str, str]]:
        """Table rows: (probe, result, value, threshold, evidence)."""
        out = []
        for p in self.probes.values():
            value = "-" if p.value is None else f"{p.value:.3g}"
            thr = "-" if p.threshold is None else f"{p.threshold:.0e}" if p.threshold else "0"
            out.append((p.name, p.status.upper(), value, thr, p.summary))
        return out

    def table(self, width: int | None = None) -> str:
        """The report as plain text: verdict, where boundaries came from, the probe table, causes.

        ``width=None``: one line per row (logs, grep); an int wraps every long cell and line to
        that many columns, words kept whole, nothing left out (``str(report)`` uses :data:`WIDTH`).
        """
        rows = [("probe", "result", "value", "limit", "evidence"), *self.rows()]
        cells = text_table([r[:4] for r in rows])  # the first four columns lined up; the evidence wraps after
        lines = _wrap(self.verdict, width)
        lines += _wrap(f"examples: {len(self.example_ids)}; boundaries from {self.boundaries}; "
                       f"forward: {self.forward}; audit took {self.seconds:.2f} s", width)
        for r, prefix in zip(rows, cells, strict=True):
            lines += _wrap(r[4], width, prefix + "  ")
        lines += [x for note in self._notes() for x in _wrap(note, width)]
        if self.findings:
            lines.append("findings (configuration checks):")
            # indented, name and status lined up (status at least as wide as the probes' SKIPPED)
            cells = text_table([("", f.name, f"{f.status.upper():7}") for f in self.findings])
            for f, prefix in zip(self.findings, cells, strict=True):
                fix = f" Fix: {f.fix}" if f.failed and f.fix else ""
                lines += _wrap(f"{_sentence(f.evidence)}{fix}", width, prefix + "  ")
        lines += [x for c in self.causes for x in _wrap(f"likely cause: {c}", width)]
        return "\n".join(lines)

    def _notes(self) -> list[str]:
        """The worst pair, how to read the table's numbers, and what each skipped probe means."""
        notes = []
        if self.worst_pair is not None:
            notes.append(f"worst pair: {self.worst_pair}")
        grad = self.probes.get("gradient")
        if self.worst_pair is not None or (grad is not None and grad.failed):
            notes.append("reading the numbers: each probe's value is its worst case over all pairs of "
                         "examples. perturbation: the largest change of one example's logits when "
                         "another's tokens change. gradient: the largest ratio |d loss_j / d emb_i| / "
                         "|d loss_j / d emb_j| (1 means example i moves j's loss as much as j's own "
                         "tokens do). The worst pair is the pair with the largest logit change; its own "
                         "gradient ratio can be smaller than the gradient row's maximum.")
        for name, p in self.probes.items():
            if p.status == "skipped":
                how = p.details.get("how_to_get") or HOW_TO_GET.get(name, "see the evidence column")
                notes.append(f"skipped {name}: not measured, so it is neither a pass nor a fail. "
                             f"To get it: {how}.")
        return notes

    def to_html(self) -> str:
        """The same report as an HTML table (notebooks show it through ``_repr_html_``)."""
        color = {"PASS": "#1a7f37", "FAIL": "#cf222e", "SKIPPED": "#9a6700"}
        cells = "".join(
            f"<tr><td><code>{n}</code></td><td style='color:{color[s]};font-weight:bold'>{s}</td>"
            f"<td>{v}</td><td>{t}</td><td style='text-align:left'>{html.escape(e)}</td></tr>"
            for n, s, v, t, e in self.rows()
        )
        extra = self._notes() + [f"likely cause: {c}" for c in self.causes]
        notes = "".join(f"<li>{html.escape(x)}</li>" for x in extra)
        if self.findings:
            found = "".join(
                f"<tr><td><code>{html.escape(f.name)}</code></td><td style='color:"
                f"{color[f.status.upper()]};font-weight:bold'>{f.status.upper()}</td><td style="
                f"'text-align:left'>{html.escape(f.evidence)}</td><td style='text-align:left'>"
                f"{html.escape(f.fix if f.failed else '')}</td></tr>"
                for f in self.findings
            )
            notes += ("</ul><p>findings (configuration checks)</p><table><tr><th>finding</th>"
                      f"<th>result</th><th>evidence</th><th>fix</th></tr>{found}</table><ul>")
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
        return self.table(width=WIDTH)

    def console(self, stream=None) -> str:
        """The table for printing to ``stream`` (default ``sys.stdout``): :data:`WIDTH` columns on a
        terminal, one line per row when it is a file or a CI log (``packsim audit`` prints this)."""
        import sys

        stream = sys.stdout if stream is None else stream
        return self.table(width=WIDTH if getattr(stream, "isatty", lambda: False)() else None)


def _wrap(text: str, width: int | None, first: str = "") -> list[str]:
    """``first + text`` as lines of at most ``width`` columns, later lines indented under ``text``
    when ``first`` is a table row's leading cells (else by two spaces); the text goes on the lines
    below the cells when they leave it under 40 columns or too few for its longest word (a word
    longer than a whole line is cut there, the only case); one line when width is None."""
    if width is None:
        return [first + text]
    longest = max((len(word) for word in text.split()), default=0)
    if first and (len(first) > width - 40 or longest > width - len(first)):
        # the leading cells leave too little room (or a word would be cut): the text goes below them
        return [first.rstrip()] + textwrap.wrap(text, width, initial_indent="    ", subsequent_indent="    ",
                                                break_on_hyphens=False)
    indent = " " * len(first) if first else "  "
    return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=indent,
                         break_on_hyphens=False) or [first.rstrip()]


