"""The audit's shared pass: the leak probes from the forwards the audit's floor needs, on a clean batch.

The floor of an isolation audit with a gradient is one packed forward that keeps its graph, one
backward, and every example alone. The shared pass runs:

1. the baseline once (:func:`shared_baseline`): the pipeline's forward in the model's mode, the
   input embeddings' output made a leaf (B, T, d) that requires grad (a forward hook on
   ``get_input_embeddings()``), the graph kept, and ``output_attentions=True`` for a collator
   dict: the perturbation's reference, the gradient probe's graph and the attention maps are one
   forward;
2. every example alone vs the baseline (:func:`~packsim.auditing.packed_vs_alone.compare_alone`);
3. one packed forward with every chosen example's tokens changed at once (:func:`joint_perturbation`):
   no other example may move, and one changed example at least must (the forward reads input_ids);
4. two backwards of the chosen examples' summed losses from the baseline's graph
   (:func:`joint_gradient`), the second with weights 2**k: in a forward that isolates, example i's
   embeddings get its own loss's gradient only, so the first is exactly 0 on every other example
   and the second exactly 2**k_i times the first on chosen example i (a power of two scales a float
   exactly); a gradient across examples, the chosen ones among themselves included, breaks one of
   the two, whether the forward or only the backward (a kernel's) crosses the boundary.

A batch that passes all four is isolated: every example equals itself alone, no example moves when
the chosen ones change, and no loss sends gradient to another example. Anything else (a
contaminated example, one that moved, a gradient that does not scale, nothing that moved) and
:func:`leak_probes` runs the pair probes of :mod:`packsim.auditing.probes` (one forward per
perturbed example, one backward per differentiated one), so a failing verdict and its matrices are
the pair probes' own. Measured cost: benchmarks/audit_cost.py (RESULTS.md section 6).

Shapes: ids (B, T); logits (B, T, V); emb (B, T, d); change / ratio (S, S), NaN where not
measured. From the shared pass, row i of ``change`` holds example i's own change and the change of
each unchanged example while all chosen ones changed; column j of ``ratio`` holds 1 at j and, for
each other example, the gradient it got from the chosen losses together (the weighted residual for
a chosen one) over the smallest own gradient.

Lessons: none directly (packsim.audit and audit_trainer run it).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch

from packsim.auditing.packed_vs_alone import alone_change, compare_alone
from packsim.auditing.pipeline import ForwardOutput, Pipeline, same_randomness
from packsim.auditing.probes import (
    example_loss,
    gradient,
    per_example_max,
    perturbation,
    probe_examples,
    shift_plan,
    shift_where,
    vocab_size,
)
from packsim.auditing.report import ProbeResult
from packsim.core.device import model_device
from packsim.core.errors import PacksimError
from packsim.core.upstream.loggers import quiet_no_attention_weights

__all__ = ["Graph", "Shared", "baseline", "leak_probes", "shared_baseline"]

MAX_TOGETHER = 8  # examples changed / weighted together: weights up to 2**7 stay far from overflow


@dataclass
class Graph:
    """The baseline's logits with their autograd graph back to the input embeddings."""

    logits: torch.Tensor  # (B, T, V), requires grad
    emb: torch.Tensor  # (B, T, d) leaf: the input embeddings' output


@dataclass
class Shared:
    """The baseline forward: its output (logits detached), its graph, whether it carries attentions."""

    out: ForwardOutput
    graph: Graph | None = None
    attentions: bool = False  # out.attentions are this forward's own (output_attentions=True)
    clean: bool = False  # the shared pass showed every example equal to itself alone (set by leak_probes)
    shift: tuple[float | None, str] | None = None  # the positions probe's shift test, from the alone forward


def baseline(p: Pipeline, seed: int) -> ForwardOutput:
    """The pipeline's forward as given, no graph (PacksimError when the model refuses the batch)."""
    device = model_device(p.model)
    try:
        with torch.no_grad(), same_randomness(seed, device):
            out = p.run()
    except TypeError as err:
        raise PacksimError(
            f"the model's forward does not accept this batch ({err}). The audit runs the "
            f"pipeline's forward exactly as given, {p.forward}: pass only the fields and kwargs "
            "that forward takes (e.g. drop seq_idx / cu_seq_lens_* for a model without **kwargs)."
        ) from err
    _check_logits(p, out)
    return out


def _check_logits(p: Pipeline, out: ForwardOutput) -> None:
    if tuple(out.logits.shape[:2]) != tuple(p.input_ids.shape):
        raise PacksimError(
            f"the model returned logits {tuple(out.logits.shape)} for input_ids "
            f"{tuple(p.input_ids.shape)}: audit a causal LM that returns one logit row per token."
        )


def shared_baseline(p: Pipeline, seed: int, record: bool) -> Shared:
    """The baseline, recorded for the other probes when ``record`` (graph, attentions); else plain.

    Whatever goes wrong with the recorded forward, the plain :func:`baseline` runs and says what.
    """
    if record:
        try:
            shared = _recorded(p, seed)
        except Exception:  # noqa: BLE001 - the plain baseline below raises (or not) on its own
            shared = None
        if shared is not None:
            return shared
    return Shared(baseline(p, seed))


def _recorded(p: Pipeline, seed: int) -> Shared | None:
    ask = p.context.get("kind") == "dict"  # a PackedBatch's maps come from packsim's own attention
    try:
        module = p.model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        module = None
    B, T = p.input_ids.shape
    caught: dict[str, torch.Tensor] = {}

    def leaf(_module, _args, out):
        if caught or not isinstance(out, torch.Tensor) or not out.is_floating_point() \
                or tuple(out.shape[:2]) != (B, T):
            return None
        caught["emb"] = out.detach().requires_grad_(True)  # (B, T, d)
        return caught["emb"]

    # transformers' activation checkpointing drops the cache in train mode (modeling_layers.
    # GradientCheckpointingLayer): always, or only with grad, per version (packsim.core.upstream.outputs
    # says which). The other probes' forwards run without grad, so a checkpointed model in train mode
    # keeps a graph-free baseline, as they see it
    checkpointed = p.model.training and any(getattr(m, "gradient_checkpointing", False) is True
                                            for m in p.model.modules())
    handle = module.register_forward_hook(leaf) if isinstance(module, torch.nn.Module) and not checkpointed \
        else None
    if handle is None and not ask:
        return None
    try:
        grad = torch.enable_grad() if handle is not None else torch.no_grad()
        quiet = quiet_no_attention_weights() if ask else nullcontext()
        with grad, quiet, same_randomness(seed, model_device(p.model)):
            out = p.run(output_attentions=True) if ask else p.run()
    finally:
        if handle is not None:
            handle.remove()
    _check_logits(p, out)
    logits = out.logits
    graph = Graph(logits, caught["emb"]) if "emb" in caught and logits.requires_grad else None
    return Shared(ForwardOutput(logits.detach(), out.cache, out.attentions if ask else None), graph, ask)


def _changed_ids(p: Pipeline, chosen: list[int], seed: int) -> torch.Tensor:
    """input_ids (B, T) with every chosen example's tokens shifted by the offsets the pair probe draws."""
    V = vocab_size(p.model)
    gen = torch.Generator().manual_seed(seed)
    ids = p.input_ids.clone()
    for i in chosen:
        where = p.seq == i
        ids[where] = (ids[where] + int(torch.randint(1, V, (1,), generator=gen))) % V
    return ids


def joint_perturbation(p: Pipeline, base: torch.Tensor, chosen: list[int], alone, tol: float,
                       seed: int) -> tuple[ProbeResult, torch.Tensor] | None:
    """The perturbation probe from one forward with every chosen example changed; None unless clean."""
    S = len(p.example_ids)
    with torch.no_grad(), same_randomness(seed, base.device):
        moved = p.run(input_ids=_changed_ids(p, chosen, seed)).logits.float()  # (B, T, V)
    change_of = per_example_max((moved - base).abs().amax(-1), p.seq, S).cpu()  # (S,)
    rest = [j for j in range(S) if j not in chosen]
    others = float(change_of[rest].max()) if rest else 0.0
    if others > tol or bool((change_of[chosen] <= tol).all()):
        return None  # something moved, or nothing did: the pair probe measures it
    change = torch.full((S, S), float("nan"))
    for i in chosen:
        change[i, rest] = change_of[rest]
        change[i, i] = change_of[i]
    a_change, a_offset = alone
    summary = (f"every example packed vs alone: max |logit change| {float(a_change.max()):.3g} over all {S} "
               f"examples; max |change| of another example's logits when {len(chosen)} of {S} examples' tokens "
               f"change together in one forward: {others:.3g} (0 leaking pairs)")
    details = {"leaking_pairs": 0, "alone": a_change.tolist(), "alone_offset": a_offset.tolist(),
               "contaminated": [], "together": [p.example_ids[i] for i in chosen]}
    return ProbeResult("perturbation", "pass", max(others, float(a_change.max())), tol, summary,
                       details), change


def joint_gradient(p: Pipeline, graph: Graph, chosen: list[int], tol: float,
                   seed: int) -> tuple[ProbeResult, torch.Tensor] | None:
    """The gradient probe from two backwards of the chosen losses together; None unless clean."""
    S = len(p.example_ids)
    ids, seq, emb = p.input_ids, p.seq, graph.emb
    try:
        with torch.enable_grad(), same_randomness(seed, emb.device):
            losses = [example_loss(graph.logits, ids, seq, j) for j in chosen]
            (g1,) = torch.autograd.grad(sum(losses), emb, retain_graph=True)  # (B, T, d)
            weighted = sum(2.0 ** k * loss for k, loss in enumerate(losses))
            (g2,) = torch.autograd.grad(weighted, emb, retain_graph=True)  # (B, T, d)
    except (NotImplementedError, RuntimeError, TypeError, AttributeError):
        return None  # the pair probe reports why
    g1, g2 = g1.detach().float(), g2.detach().float()
    w = torch.zeros(seq.shape, device=g1.device)  # (B, T): 2**k on chosen example k, 0 elsewhere
    for k, j in enumerate(chosen):
        w[seq == j] = 2.0 ** k
    mine = (w > 0)[..., None]  # (B, T, 1)
    cross = torch.where(mine, g2 - w[..., None] * g1, g1)  # (B, T, d): what other losses sent here
    own = per_example_max(g1.abs().amax(-1), seq, S).cpu()  # (S,): the chosen ones' own gradient
    scale = float(own[chosen].min())
    if not scale > 0:
        return None
    rel = per_example_max(cross.abs().amax(-1), seq, S).cpu() / scale  # (S,)
    worst = float(rel.max())
    if worst > tol:
        return None
    ratio = torch.full((S, S), float("nan"))
    for j in chosen:
        ratio[:, j] = rel
        ratio[j, j] = 1.0
    summary = ("max |d loss / d emb_i| from other examples' losses, relative to the smallest own gradient "
               f"({len(chosen)} examples' losses, backpropagated together twice, the second weighted 2**k)")
    return ProbeResult("gradient", "pass", worst, tol, summary), ratio


def _alone_shift_plan(p: Pipeline) -> tuple[int, int] | None:
    """The positions probe's shift test as one more alone row: (example j, shift), or None."""
    j = int(torch.bincount(p.seq[p.seq >= 0], minlength=len(p.example_ids)).argmax())
    pos = p.positions if p.positions is not None else torch.arange(p.input_ids.shape[1]).expand_as(p.seq)
    plan = shift_plan(p, start=int(pos.to(p.seq.device)[p.seq == j][0]))
    return None if isinstance(plan, str) else plan


def leak_probes(p: Pipeline, base: torch.Tensor, shared: Shared, tol: float, seed: int,
                max_examples: int) -> tuple[ProbeResult, torch.Tensor, ProbeResult, torch.Tensor | None]:
    """(perturbation, change (S, S), gradient, ratio (S, S)): the shared pass where it shows the batch
    clean, else the pair probes on the examples :func:`probe_examples` picks from the alone comparison."""
    S = len(p.example_ids)
    chosen, alone = probe_examples(S, max_examples), None
    if p.run_alone is not None and len(chosen) <= MAX_TOGETHER:
        plan = _alone_shift_plan(p)
        a_change, a_offset, effect = compare_alone(p, base, tol, seed, plan)
        if not p.model.training:  # the baseline ran in eval mode: this is alone_change's answer
            alone = (a_change, a_offset)
        if bool((a_offset < 0).all()):
            joint = joint_perturbation(p, base, chosen, (a_change, a_offset), tol, seed)
            if joint is not None:
                shared.clean = True
                shared.shift = None if plan is None else (effect, shift_where(p, *plan))
                grad = None if shared.graph is None else joint_gradient(p, shared.graph, chosen, tol, seed)
                return (*joint, *(grad or gradient(p, chosen, tol, seed, shared.graph)))
    if alone is None:
        alone = alone_change(p, tol, seed, base)
    chosen = probe_examples(S, max_examples, alone)
    return (*perturbation(p, base, chosen, tol, seed, alone), *gradient(p, chosen, tol, seed, shared.graph))
