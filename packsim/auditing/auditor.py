"""The contamination audit: does a packed pipeline keep its examples apart, and count the right labels?

``packsim.audit(model, batch)`` answers "how would you detect cross-example contamination after a
run has finished?" with evidence, on a CPU, in about a second for a tiny model. It runs the SAME
forward the pipeline runs, many times with small changes, and measures:

1. **perturbation**: every example packed vs the same example alone (one batched forward of all
   examples: the cost does not grow with the batch), then for a few examples i: change the
   tokens of i, rerun, take the largest change of any other example j's logits. Isolated means
   unchanged up to float tolerance.
2. **gradient**: gradient of example j's loss with respect to example i's input embeddings,
   relative to the gradient with respect to j's own embeddings.

   On a clean batch both come from shared forwards (:mod:`packsim.auditing.shared_pass`: the
   baseline keeps its graph, the chosen examples change together in one forward, their losses
   are backpropagated together); where anything moves, one forward per changed example and one
   backward per loss say who leaks into whom.
3. **attention_mass**: the share of each query's attention that lands outside its own example,
   per layer and head (where attention probabilities can be had: packsim models, eager).
4. **loss_coverage**: which labels are counted: prompt, padding, the boundary token (predicting
   the next example's first token from the previous example's last), response, EOS.
5. **positions**: whether position ids restart at each example, and whether that matters for
   this model (RoPE is shift-invariant; absolute position embeddings are not).

``batch`` is a :class:`~packsim.core.batch.PackedBatch` (run with :func:`packsim.core.model.forward` under
its setup; ``forward_kwargs`` go to that function, e.g. ``backend="blocked"``) or a plain dict of
collator fields (run as ``model(**batch, **forward_kwargs)``, e.g. ``use_cache=False``).
Example boundaries: a PackedBatch knows its examples; for a dict batch they come from independent
evidence (``examples=``, the special tokens) where there is any, and every boundary field is
checked against it (:mod:`packsim.auditing.evidence`); the report says which.

Used by the ``packsim audit`` command.

Lessons: 07, 09, A6.
"""


from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from numbers import Integral

import torch

from packsim.auditing.attention_probe import attention_mass
from packsim.auditing.causes import likely_causes
from packsim.auditing.evidence import dict_evidence
from packsim.auditing.findings import flash_fields, has_flash_fields
from packsim.auditing.hybrid_findings import (
    hybrid_state,
    kernel_refusal,
    refused_report,
    scans_layers_once,
)
from packsim.auditing.locate import feature_examples
from packsim.auditing.no_trace import leaves_no_trace
from packsim.auditing.pipeline import (
    ForwardOutput,
    Pipeline,
    dict_pipeline,
    packed_pipeline,
)
from packsim.auditing.probes import loss_coverage, positions_probe
from packsim.auditing.report import AuditReport, Finding, ProbeResult, WorstPair
from packsim.auditing.shared_pass import leak_probes, shared_baseline
from packsim.auditing.tolerance import given_tolerance
from packsim.core.batch import PackedBatch
from packsim.core.errors import PacksimError, raised_outside_packsim
from packsim.core.upstream.window import warn_outside

# Float tolerance for "unchanged", by logits dtype. Measured cross-example changes of a leaking
# tiny Llama are 1e-2..1; an isolating forward gives exactly 0 or float round-off (~1e-7).
# the collator's per-batch fields: passed to audit() as forward keywords, they join the batch (the
# forward is the same), so the boundary reading sees them and each example alone gets its own
BATCH_FIELDS = ("attention_mask", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q",
                "max_length_k", "seq_idx", "labels")
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 3e-2}


def _pipeline(model, batch, response_mask, forward_kwargs, examples=None, objective="sft") -> tuple[Pipeline, list]:
    """The pipeline, and the evidence findings (boundary fields, special tokens) of a dict batch."""
    if isinstance(batch, PackedBatch):
        return packed_pipeline(model, batch, response_mask, forward_kwargs, objective), []
    if isinstance(batch, Mapping):
        ev = dict_evidence(model, batch, examples)
        p = dict_pipeline(model, batch, response_mask, forward_kwargs, seq=ev.seq, source=ev.source,
                          objective=objective)
        return p, ev.findings + ([flash_fields(batch, ev.seq)] if has_flash_fields(batch) else [])
    raise PacksimError(
        f"cannot audit a batch of type {type(batch).__name__}: pass a packsim.PackedBatch or the "
        "collator's dict (input_ids, labels, position_ids, ...)."
    )


@leaves_no_trace
@scans_layers_once
def audit(model, batch, response_mask=None, *, examples=None, max_examples: int = 4,
          tol: float | None = None, seed: int = 0, trust_boundaries: bool = False,
          objective: str = "sft", **forward_kwargs) -> AuditReport:
    """Audit a packed pipeline for cross-example contamination and loss-coverage bugs.

    Args:
        model: a causal LM (transformers ``*ForCausalLM`` or anything returning ``.logits``).
        batch: a :class:`~packsim.core.batch.PackedBatch` (run with ``packsim.core.model.forward`` under its
            setup) or a dict of collator fields (run as ``model(**batch, **forward_kwargs)``):
            ``input_ids`` (B, T), ``labels``, ``position_ids``, optional ``attention_mask``,
            ``cu_seq_lens_q/k``, ``max_length_q/k``, ``seq_idx``.
        response_mask: optional bool (B, T), True on response tokens and EOS; lets the loss
            probe check prompt vs response for a dict batch.
        examples: optional, the token ids of each example the collator was given (lists of ints,
            feature dicts, or packsim Examples): the independent evidence of where the examples
            are (:mod:`packsim.auditing.evidence`); without it a dict batch is checked against
            its special tokens and its fields against each other.
        max_examples: the pair probes (who leaks into whom) perturb and differentiate at most this
            many examples (the most contaminated and their predecessors first); every example is
            compared with itself run alone whatever this is.
        tol: float tolerance for "unchanged" (default by logits dtype: 1e-5 for fp32).
        seed: seeds the token perturbations and the RNG of every forward (dropout cancels out).
        trust_boundaries: the batch's own boundary fields are the ground truth (you built them from
            the examples yourself). Without it, a dict batch with no independent evidence (no
            ``examples``, no BOS / EOS to locate them by) gets the status ``"unverified"``, not a pass.
        objective: what the loss should count. ``"sft"`` (default): completion-only fine-tuning,
            prompts -100 and responses + EOS counted (told apart by ``response_mask``). ``"lm"``:
            language modelling (pretraining-style batches): every real token is a target, no
            prompt/response split expected (no ``response_mask``); padding and the label across
            each example boundary are still checked, and every label by value.
        **forward_kwargs: passed to every forward exactly as the pipeline passes them; batch fields
            among them (``attention_mask``, ``position_ids``, ...) count as the batch's fields.

    Returns an :class:`AuditReport`; ``report.ok`` is True only for a pass (``report.status ==
    "pass"``: not on "not measured" or "unverified"), and ``report.failed`` names the failures.
    The audit leaves no trace (:mod:`packsim.auditing.no_trace`): random generators, train/eval
    flags and hooks come back as they were. Used by notebook 07 and ``packsim audit``.

    Example::

        >>> from packsim import PackedBatch, audit, build_model, make_examples
        >>> model, examples = build_model("tiny", seed=0), make_examples(4, seed=0)
        >>> audit(model, PackedBatch.from_examples(examples, capacity=64, setup="correct")).status
        'pass'
        >>> audit(model, PackedBatch.from_examples(examples, capacity=64, setup="buggy")).failed
        ['perturbation', 'gradient', 'attention_mass', 'loss_coverage']
    """
    start = time.perf_counter()
    warn_outside()  # a transformers / TRL outside the tested window: one notice per process
    if not isinstance(model, torch.nn.Module):
        raise PacksimError(f"packsim.audit takes a torch model (a transformers *ForCausalLM or any nn.Module "
                           f"returning .logits), got {type(model).__name__}.")
    max_examples, seed = check_probe_options(max_examples, seed)
    if examples is not None and (isinstance(examples, torch.Tensor) or not feature_examples(examples)):
        raise PacksimError(f"examples={_short(examples)}: pass the token ids of each example the collator was "
                           "given (lists of ints, feature dicts with input_ids or prompt_ids + response_ids, "
                           "or packsim Examples), or leave it out.")
    if isinstance(batch, Mapping):  # a batch field passed as a forward keyword is still the batch's field
        moved = {k: forward_kwargs.pop(k) for k in BATCH_FIELDS if k in forward_kwargs}
        batch = {**batch, **moved} if moved else batch
    p, findings = _pipeline(model, batch, response_mask, forward_kwargs, examples, objective)
    report, _ = audit_pipeline(p, max_examples=max_examples, tol=tol, seed=seed, start=start,
                               findings=findings)
    report.trust_boundaries = trust_boundaries
    hybrid = hybrid_state(model, batch)  # stateful (SSM / conv) layers: None for attention-only models
    if hybrid and not any(f.name == "hybrid_state" for f in report.findings):  # refused: already there
        report.findings.append(hybrid)
    return report


LEAK_PROBES = ("perturbation", "gradient", "attention_mass")


def check_probe_options(max_examples, seed) -> tuple[int, int]:
    """(max_examples, seed) as ints: an integer >= 1 and an integer (numpy's too), or PacksimError
    (audit and audit_trainer)."""
    if isinstance(max_examples, bool) or not isinstance(max_examples, Integral) or max_examples < 1:
        raise PacksimError(f"max_examples={max_examples!r}: the pair probes need at least 1 example to perturb.")
    if isinstance(seed, bool) or not isinstance(seed, Integral):
        raise PacksimError(f"seed={seed!r}: give an int.")
    return int(max_examples), int(seed)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def audit_pipeline(p: Pipeline, *, max_examples: int = 4, tol: float | None = None, seed: int = 0,
                   field_causes: bool = True, start: float | None = None,
                   findings: list | None = None) -> tuple[AuditReport, ForwardOutput]:
    """The five probes on a built :class:`Pipeline` -> (report, the baseline forward's output).

    With one example there is nothing to leak into: the leak probes are skipped, saying so.
    ``field_causes=False`` (boundaries inferred from tokens, not from batch fields) leaves out
    the causes read from the batch's boundary fields. :func:`audit` and
    :func:`packsim.audit_trainer` both end here.
    """
    tol = given_tolerance(tol)
    start = time.perf_counter() if start is None else start
    S = len(p.example_ids)
    try:
        shared = shared_baseline(p, seed, record=S >= 2)  # the leak probes share its graph and maps
    except PacksimError as err:  # packsim's own word on the input: one line, unless a finding explains it
        fields = p.context.get("fields") or {}
        if not (any(f.status == "fail" for f in findings or ())
                or (has_flash_fields(fields) and flash_fields(fields).failed)):
            raise
        tol = TOLERANCE.get(next(p.model.parameters()).dtype, 1e-5) if tol is None else float(tol)
        return _forward_failed(p, err, tol, start, findings)  # e.g. a stale max_length_q: FAIL (flash_fields)
    except Exception as err:  # noqa: BLE001 - a backend's failure is a verdict (NOT MEASURED), not a traceback
        tol = TOLERANCE.get(next(p.model.parameters()).dtype, 1e-5) if tol is None else float(tol)
        refused = kernel_refusal(p.model, err)  # a hybrid's torch fallback refusing seq_idx
        if refused:
            return refused_report(p, refused, tol, start, findings, LEAK_PROBES)
        return _forward_failed(p, err, tol, start, findings)
    base_out = shared.out
    base = base_out.logits.float()  # (B, T, V)
    tol = TOLERANCE.get(base_out.logits.dtype, 1e-5) if tol is None else float(tol)
    probes: dict[str, ProbeResult] = {}
    change, ratio, outside = torch.full((S, S), float("nan")), None, None  # (S, S), (S, S), (L, H)
    if S < 2:
        why = "the batch holds one example: there is no other example to leak into (audit more batches)"
        for name in LEAK_PROBES:
            probes[name] = ProbeResult(name, "skipped", None, tol, why)
    else:
        try:
            probes["perturbation"], change, probes["gradient"], ratio = leak_probes(p, base, shared, tol, seed,
                                                                                   max_examples)
            probes["attention_mass"], outside = attention_mass(p, base, tol,
                                                               base_out if shared.attentions else None)
        except Exception as err:  # the model's own forward on a probe's rows (each example alone, a perturbed
            if not raised_outside_packsim(err):  # row): a verdict; a fault of packsim's own code stays a crash
                raise
            return _forward_failed(p, err, tol, start, findings, "a probe's forward (examples alone, a "
                                   "perturbed row)")
        shared.graph = None  # free the baseline's graph
    # eval-mode logits where the baseline ran in eval mode, or (fp32 / fp64) every example matched
    # itself alone in eval mode: what audit_trainer's accumulation check reuses instead of a forward
    in_eval = not p.model.training or (shared.clean and base_out.logits.dtype in (torch.float32, torch.float64))
    base_out = ForwardOutput(base_out.logits, base_out.cache, in_eval=in_eval)  # maps: in the probe
    probes["loss_coverage"] = loss_coverage(p)
    probes["positions"] = positions_probe(p, tol, shared.shift)
    if field_causes:
        causes = likely_causes(p, probes, base_out)
    else:  # boundaries came from tokens: the field-based leak causes do not apply
        quiet = {k: replace(v, status="pass") if k in LEAK_PROBES else v for k, v in probes.items()}
        causes = likely_causes(p, quiet, base_out)
    report = AuditReport(
        probes=probes, boundaries=p.boundaries, example_ids=p.example_ids, forward=p.forward,
        logit_change=change, gradient_ratio=ratio, attention_outside=outside,
        worst_pair=worst_pair(p.example_ids, change, ratio), causes=causes,
        seconds=time.perf_counter() - start, findings=list(findings or []),
    )
    return report, base_out


def _forward_failed(p: Pipeline, err: Exception, tol: float, start: float, findings: list | None,
                    which: str = "the pipeline's forward") -> tuple[AuditReport, ForwardOutput]:
    """NOT MEASURED for a forward that raised inside a backend (e.g. transformers' ``get_target_dtype``
    finding no ``nn.Linear`` in GPT-2 on the flash path: ``StopIteration``): the leak probes and the
    positions are skipped naming the exception; loss coverage needs no forward and still runs."""
    first = (str(err).splitlines() or [""])[0][:200]
    impl = getattr(getattr(p.model, "config", None), "_attn_implementation", None)
    why = (f"not measured: {which} raised {type(err).__name__}"
           f"{': ' + first if first else ''} (attn_implementation={impl!r}), so no probe that needs it ran")
    probes = {name: ProbeResult(name, "skipped", None, tol, why) for name in (*LEAK_PROBES, "positions")}
    probes["loss_coverage"] = loss_coverage(p)
    S = len(p.example_ids)
    fix = ("fix the failing finding (the forward refused the batch it names), then audit again"
           if isinstance(err, PacksimError) else "run the same batch under another attention implementation "
           "(eager or sdpa), or fix the error the forward raises; then audit again")
    finding = Finding("forward", "skipped", why, fix)
    report = AuditReport(probes=probes, boundaries=p.boundaries, example_ids=p.example_ids, forward=p.forward,
                         logit_change=torch.full((S, S), float("nan")), gradient_ratio=None,
                         attention_outside=None, worst_pair=None, causes=[],
                         seconds=time.perf_counter() - start, findings=[*(findings or []), finding])
    dtype = next(p.model.parameters()).dtype
    return report, ForwardOutput(torch.empty((*p.input_ids.shape, 0), dtype=dtype))


def worst_pair(ids: list[int], change: torch.Tensor, ratio) -> WorstPair | None:
    cross = torch.nan_to_num(change.clone().fill_diagonal_(float("nan")), nan=-1.0)
    if len(ids) < 2 or float(cross.max()) <= 0:  # nothing moved: no offending pair
        return None
    flat = int(cross.argmax())
    i, j = divmod(flat, len(ids))
    g = None if ratio is None or torch.isnan(ratio[i, j]) else float(ratio[i, j])
    return WorstPair(ids[i], ids[j], float(cross[i, j]), g)


