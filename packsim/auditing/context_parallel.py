"""The audit of a context-parallel pipeline: each rank's shard against the documents it holds.

Under context parallelism (CP) one packed row ``(1, T)`` is cut over ``R`` ranks, and no rank ever
holds a whole row's logits: rank ``r`` computes ``(1, T/R, V)`` for the row positions ``held``
``(T/R,)`` it was given (after a load balancer's rearrangement, so they need not be contiguous).
:func:`audit_context_parallel` runs on every rank at once (a collective over ``group``) with:

- ``cp_forward(input_ids) -> (1, T/R, V)``: the pipeline's own context-parallel forward of a whole
  row ``(1, T)`` (it shards, runs the ranks' attention, returns this rank's logits);
- ``lengths``: the documents of the row, from evidence the shards did not produce (the dataset);
- optionally the shard's ``position_ids`` and ``targets`` ``(1, T/R)`` as the pipeline fed them
  (``targets`` already shifted: ``targets[0, k]`` is what position ``held[k]`` predicts).

It measures, on each rank's shard:

- **packed vs alone** (finding ``context_parallel``): the shard's logits of every document piece it
  holds against that document run alone through ``model`` (one process, positions from 0);
- **perturbation**: document ``i``'s tokens changed, the whole CP forward rerun, the largest change
  of document ``j``'s logits on any rank (``logit_change`` (D, D), max over the ranks);
- **positions**: the shard's positions against each held token's offset in its document;
- **loss_coverage**: every counted target of the shard is the next token of the same document
  (a label shifted after sharding, or across a boundary, fails).

The gradient and attention-mass probes are not measured (skipped: a CP forward takes tokens).
Every rank returns the same :class:`~packsim.auditing.report.AuditReport`; a failure names context
parallelism as the cause. Tolerance ``tol`` (default :data:`CP_TOLERANCE` by the logits' dtype):
float32 logits of a CP run and of one process differ by float summation order only, an order of
magnitude under float32's 1e-4 on the course's tiny model (``benchmarks/RESULTS.md`` has the numbers).

Lessons: none directly (lesson 10 prints its verdicts through packsim.scaling.cp_compare).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from packsim.auditing.no_trace import no_trace
from packsim.auditing.report import AuditReport, Finding, ProbeResult, WorstPair
from packsim.auditing.tolerance import given_tolerance
from packsim.core.errors import PacksimError
from packsim.core.loss import IGNORE_INDEX

__all__ = ["CP_TOLERANCE", "audit_context_parallel"]

CP_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 5e-2}
_NOT_CP = "not measured for a context-parallel forward"


def _layout(lengths, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(doc (T,) document id of every row position, starts (D,))."""
    lens = torch.as_tensor(list(lengths), dtype=torch.long).reshape(-1)
    if lens.numel() == 0 or bool((lens <= 0).any()) or int(lens.sum()) != T:
        raise PacksimError(f"lengths must be positive document lengths that sum to the row's {T} tokens, "
                           f"got {lens.tolist()} (sum {int(lens.sum())}).")
    return torch.repeat_interleave(torch.arange(lens.numel()), lens), torch.cumsum(lens, 0) - lens


def _reduce(t: torch.Tensor, group, op=None) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(t, op=op or dist.ReduceOp.SUM, group=group)
    return t


def _alone_diff(model, input_ids, doc, starts, held, local) -> torch.Tensor:
    """(D,) max |shard logits - the document alone| over the pieces this rank holds (-1: holds none)."""
    D = starts.numel()
    out = torch.full((D,), -1.0, dtype=torch.float64)
    mine = doc[held]  # (T/R,) document of each held position
    for d in mine.unique().tolist():
        L = int((doc == d).sum())
        s = int(starts[d])
        alone = model(input_ids=input_ids[:, s : s + L], position_ids=torch.arange(L)[None], use_cache=False).logits
        k = (mine == d).nonzero().flatten()
        diff = (local[0, k].float() - alone[0, held[k] - s].float()).abs().max()
        out[d] = float(diff)
    return out


def _perturbed(input_ids, starts, lengths, i: int, vocab: int) -> torch.Tensor:
    ids = input_ids.clone()
    s, L = int(starts[i]), int(lengths[i])
    ids[:, s : s + L] = (ids[:, s : s + L] + 1 + torch.arange(L) % 7) % vocab  # every token changed
    return ids


def _probe(name, failed: bool, value, tol, summary, details=None) -> ProbeResult:
    return ProbeResult(name, "fail" if failed else "pass", value, tol, summary, details or {})


def audit_context_parallel(model, cp_forward, input_ids: torch.Tensor, lengths, held: torch.Tensor, *,
                           position_ids: torch.Tensor | None = None, targets: torch.Tensor | None = None,
                           group=None, tol: float | None = None, max_perturbed: int = 16) -> AuditReport:
    """Audit this rank's shard of a context-parallel forward (every rank calls it; see the module doc)."""
    start, tol = time.perf_counter(), given_tolerance(tol)
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise PacksimError(f"input_ids must be one packed row (1, T), got {tuple(input_ids.shape)}.")
    T = int(input_ids.shape[1])
    doc, starts = _layout(lengths, T)
    lens = torch.as_tensor(list(lengths))
    held = torch.as_tensor(held).reshape(-1).long()
    rank, R = (dist.get_rank(group), dist.get_world_size(group)) if dist.is_initialized() else (0, 1)
    D = starts.numel()
    with no_trace(model), torch.no_grad():
        local = cp_forward(input_ids)  # (1, T/R, V)
        if local.shape[:2] != (1, held.numel()):
            raise PacksimError(f"cp_forward returned {tuple(local.shape)}, this rank holds {held.numel()} tokens.")
        tol = CP_TOLERANCE.get(local.dtype, 1e-4) if tol is None else float(tol)
        per_rank = torch.zeros(R, D, dtype=torch.float64)  # max |shard - alone| per rank and document
        per_rank[rank] = _alone_diff(model, input_ids, doc, starts, held, local)
        _reduce(per_rank, group)
        chosen = torch.linspace(0, D - 1, min(D, max_perturbed)).round().long().unique().tolist()
        change = torch.zeros(D, D, dtype=torch.float64)
        mine = doc[held]
        for i in chosen:
            moved = (cp_forward(_perturbed(input_ids, starts, lens, i, model.config.vocab_size)) - local).abs()
            for j in mine.unique().tolist():
                change[i, j] = float(moved[0, mine == j].max())
        _reduce(change, group, dist.ReduceOp.MAX if dist.is_initialized() else None)
    logit_change = torch.full((D, D), float("nan"), dtype=torch.float64)
    logit_change[chosen] = change[chosen]
    off = change[chosen].clone()
    off[torch.arange(len(chosen)), torch.tensor(chosen)] = 0.0  # a document's own change is expected
    worst = divmod(int(off.argmax()), D)
    leak = float(off.max())
    worst_pair = WorstPair(chosen[worst[0]], worst[1], leak, None) if leak > tol else None
    probes = {"perturbation": _probe(
        "perturbation", leak > tol, leak, tol,
        f"{len(chosen)} of {D} documents changed one at a time through the {R}-rank forward: the largest change "
        f"of another document's logits on any rank is {leak:.3g}", {"perturbed": chosen})}
    probes["gradient"] = ProbeResult("gradient", "skipped", None, None, _NOT_CP,
                                     {"how_to_get": "the perturbation probe measures isolation through the CP "
                                                    "forward; audit one process with packsim.audit for gradients"})
    probes["attention_mass"] = ProbeResult("attention_mass", "skipped", None, None, _NOT_CP,
                                           {"how_to_get": "audit the model on one process (packsim.audit)"})
    probes["loss_coverage"] = _targets_probe(input_ids, doc, held, targets, group)
    probes["positions"] = _positions_probe(doc, starts, held, position_ids, group)
    worst_alone = float(per_rank.max())
    finding = Finding("context_parallel", "fail" if worst_alone > tol else "pass", _evidence(per_rank, R, tol),
                      "" if worst_alone <= tol else _fix(leak > tol))
    report = AuditReport(
        probes=probes, boundaries="the documents' lengths given (lengths=), independent of the shards",
        example_ids=list(range(D)), forward=f"a context-parallel forward on {R} rank(s), {held.numel()} of {T} tokens "
        f"on each; tolerance {tol:.0e}", logit_change=logit_change, gradient_ratio=None, attention_outside=None,
        worst_pair=worst_pair, causes=[], seconds=time.perf_counter() - start, findings=[finding])
    report.causes = _causes(report, leak > tol, worst_alone > tol, R)
    return report


def _evidence(per_rank: torch.Tensor, R: int, tol: float) -> str:
    parts = []
    for r in range(R):
        held = (per_rank[r] >= 0).nonzero().flatten()
        d = int(held[per_rank[r, held].argmax()])
        parts.append(f"rank {r} holds pieces of {held.numel()} documents, its logits vs each document alone: "
                     f"max {float(per_rank[r, d]):.3g} (document {d})")
    return "; ".join(parts) + f" (limit {tol:.0e})"


def _fix(leaks: bool) -> str:
    if leaks:
        return ("give the context-parallel attention the documents: a document mask sharded with them (torch: a flex "
                "BlockMask through _context_parallel_shard with _PerDocumentHeadTailLoadBalancer), or a varlen ring "
                "with cu_seqlens (ring-flash-attn's varlen API, Axolotl's varlen_llama3), never a plain causal ring")
    return ("every rank must see all keys of its documents: gather or rotate K/V over the whole CP group, and "
            "shard positions and targets with the tokens (one load balancer for every buffer)")


def _causes(report: AuditReport, leaks: bool, differs: bool, R: int) -> list[str]:
    out = []
    if leaks:
        out.append(f"context parallelism: the attention across the {R} ranks' shards ignores the document "
                   "boundaries (K/V of other documents reach a document's queries through the ring or "
                   f"all-gather: a plain causal mask over the row); fix: {_fix(True)}")
    elif differs:
        out.append("context parallelism: the shards' logits differ from the documents alone although no document "
                   f"moves another: the documents lost their own context across ranks; fix: {_fix(False)}")
    if report.probes["positions"].failed:
        out.append("context parallelism: the shards' position_ids are not each token's offset in its document; "
                   "shard the position ids of the whole row with the same load balancer as the tokens")
    if report.probes["loss_coverage"].failed:
        out.append("context parallelism: counted targets are not the next token of the same document; shift the "
                   "labels once over the whole row before sharding, never on a shard")
    return out


def _positions_probe(doc, starts, held, position_ids, group) -> ProbeResult:
    if position_ids is None:
        return ProbeResult("positions", "skipped", None, None, "no position_ids given",
                           {"how_to_get": "pass the shard's position_ids="})
    expected = held - starts[doc[held]]  # (T/R,) offset of every held token in its document
    wrong = torch.tensor([float((position_ids.reshape(-1).cpu() != expected).sum())])
    _reduce(wrong, group)
    n = int(wrong)
    return _probe("positions", n > 0, float(n), 0.0,
                  f"{n} token(s) on the shards whose position is not its offset in its document")


def _targets_probe(input_ids, doc, held, targets, group) -> ProbeResult:
    if targets is None:
        return ProbeResult("loss_coverage", "skipped", None, None, "no targets given",
                           {"how_to_get": "pass the shard's shifted targets="})
    tgt = targets.reshape(-1).cpu()
    counted = (tgt != IGNORE_INDEX).nonzero().flatten()
    p = held[counted]  # row positions that predict a counted target
    T = doc.numel()
    nxt = (p + 1).clamp(max=T - 1)
    crossing = (p + 1 >= T) | (doc[nxt] != doc[p])
    wrong = ~crossing & (input_ids[0, nxt].cpu() != tgt[counted])
    counts = torch.tensor([float(counted.numel()), float(crossing.sum()), float(wrong.sum())])
    _reduce(counts, group)
    n, c, w = (int(x) for x in counts)
    return _probe("loss_coverage", c + w > 0, float(c + w), 0.0,
                  f"{n} counted targets on the shards: {c} predict across a document boundary, {w} are not the next "
                  "token of their document",
                  {"not_measured": "which targets are prompt and which response",
                   "measured": "on every rank's shard, each counted target checked against the next token of its document"})
