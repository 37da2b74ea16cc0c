"""Log-prob isolation for sequence-level objectives (DPO, GRPO/PPO): per-sequence summed log-probs,
packed call vs each sequence alone.

Preference and RL losses are not token means: DPO compares the summed log-prob of a chosen and a
rejected completion, GRPO/PPO weigh each completion's log-probs by its advantage. A leak across a
packed boundary therefore moves the quantity the trainer optimises. :func:`audit_logprobs` runs
the pipeline's forward on the packed batch, sums ``log p(token | prefix)`` over each sequence's
completion tokens, runs every sequence alone (input_ids (1, L), no positions, no mask) and
compares the sums. The tolerance grows with the tokens summed: ``LOGPROB_TOL[dtype]`` per token
(fp32 1e-5), by the dtype the forward computes in (the least precise its layers output, so bf16
under autocast or an accelerate-prepared bf16 forward that returns float32 logits). The report names the worst sequence ("pair 1 rejected", "group 0 completion 2").

Batch: a collator dict, input_ids (B, T), as the forward gets it (position_ids, seq_idx,
cu_seq_lens_*, attention_mask ...). Completion tokens come from ``completion_mask`` (B, T) (TRL's
name; 1 = the token's log-prob counts) or else ``labels != -100``. Where the sequences are comes,
as in :func:`packsim.audit`, from independent evidence first (:mod:`packsim.auditing.evidence`:
``seq`` (B, T) or ``examples`` given, else the BOS / EOS tokens), and the batch's own boundary
fields are compared with it (a ``boundary_fields`` finding); with no independent evidence the
sequences are the batch's fields (:func:`packsim.core.boundaries.find_boundaries`: cu_seq_lens_q >
seq_idx > position_ids restarts, attention_mask zeros as padding) and an isolated verdict is
``"unverified"``, not a pass, unless ``trust_boundaries=True``. Keys the model does not take
(``completion_mask``, ``ref_*_logps``) are left out of the forward.

Lessons: A8.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from packsim.auditing.evidence import dict_evidence
from packsim.auditing.hybrid_findings import needs_cuda_reason
from packsim.auditing.no_trace import leaves_no_trace
from packsim.auditing.report import rests_on_metadata
from packsim.auditing.tolerance import given_tolerance, least_precise, watch_dtypes
from packsim.core.boundaries import ROWS_SOURCE, find_boundaries
from packsim.core.errors import PacksimError
from packsim.core.loss import IGNORE_INDEX
from packsim.core.upstream.window import warn_outside

__all__ = ["LOGPROB_TOL", "LogprobReport", "SequenceLogprob", "audit_logprobs", "group_names", "pair_names"]

# per summed token, by logits dtype (fp32 log_softmax round-off is ~1e-7 per token)
LOGPROB_TOL = {torch.float64: 1e-9, torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 3e-2}
NON_MODEL_KEYS = ("completion_mask", "ref_chosen_logps", "ref_rejected_logps", "advantages", "old_per_token_logps")


def pair_names(n_pairs: int) -> list[str]:
    """Names for a DPO batch in TRL's order: the chosen of every pair, then the rejected."""
    return [f"pair {i} chosen" for i in range(n_pairs)] + [f"pair {i} rejected" for i in range(n_pairs)]


def group_names(n_groups: int, size: int) -> list[str]:
    """Names for RL completions, ``size`` per prompt group, group by group."""
    return [f"group {g} completion {k}" for g in range(n_groups) for k in range(size)]


@dataclass(frozen=True)
class SequenceLogprob:
    """One sequence: summed completion log-prob packed and alone, |change|, tokens summed, its tolerance."""

    name: str
    packed: float
    alone: float
    tokens: int
    tol: float

    @property
    def change(self) -> float:
        return abs(self.packed - self.alone)

    @property
    def ok(self) -> bool:
        return self.change <= self.tol


@dataclass
class LogprobReport:
    """``status``: "isolated", "leaks", "unverified" (isolated as the batch's own boundary fields mark
    the sequences, nothing independent locating them) or "not measured" (``note`` says why);
    ``worst``: the sequence whose summed log-prob moved most; ``boundaries``: where the sequences
    came from; ``findings``: the boundary fields read against the independent evidence."""

    sequences: list[SequenceLogprob]
    status: str
    dtype: str
    forward: str
    note: str = ""
    boundaries: str = ""
    findings: list = field(default_factory=list)
    computed: str = ""  # the dtype the forward computes in, where it is not the logits'
    per_token: float | None = None  # the tolerance per summed token that judged

    @property
    def ok(self) -> bool:
        return self.status == "isolated"

    @property
    def worst(self) -> SequenceLogprob | None:
        return max(self.sequences, key=lambda s: s.change, default=None)

    def text(self) -> str:
        if self.status == "not measured":
            return f"log-prob isolation: NOT MEASURED ({self.note})"
        if not self.sequences:
            return f"log-prob isolation: {self.status.upper()} ({self.note})"
        w = self.worst
        tol = LOGPROB_TOL.get(getattr(torch, self.dtype, None), 1e-5) if self.per_token is None else self.per_token
        computed = f" computed in {self.computed}" if self.computed and self.computed != self.dtype else ""
        lines = [f"log-prob isolation: {self.status.upper()} ({len(self.sequences)} sequences, logits "
                 f"{self.dtype}{computed}, tolerance {tol:.0e} per token); worst: {w.name}, summed log-prob {w.packed:.5f} packed vs {w.alone:.5f} alone "
                 f"(change {w.change:.2e}, {w.tokens} tokens)" + (f"; {self.note}" if self.note else ""),
                 f"sequences from {self.boundaries}" if self.boundaries else "", f"forward: {self.forward}"]
        lines = [x for x in lines if x]
        lines += [f"  {f.name}: {f.status.upper()}: {f.evidence}" + (f" Fix: {f.fix}" if f.failed and f.fix else "")
                  for f in self.findings]
        lines += [f"  {s.name:<24} packed {s.packed:11.5f}  alone {s.alone:11.5f}  change {s.change:.2e}"
                  f"{'' if s.ok else '  LEAKS'}" for s in self.sequences]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()


def _next_token_logps(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """(B, T) log p(ids[t] | ids[<t]) from logits (B, T, V); column 0 is 0 (nothing predicts it)."""
    logp = torch.log_softmax(logits[:, :-1].double(), -1).gather(-1, ids[:, 1:, None])[..., 0]  # (B, T-1)
    return torch.cat([torch.zeros_like(logp[:, :1]), logp], 1)


def _completion(batch: dict, shape) -> torch.Tensor:
    if batch.get("completion_mask") is not None:
        mask = torch.as_tensor(batch["completion_mask"]).bool()
    elif batch.get("labels") is not None:
        mask = torch.as_tensor(batch["labels"]) != IGNORE_INDEX
    else:
        raise PacksimError("audit_logprobs needs the completion tokens: pass completion_mask=(B, T) "
                           "(1 where a token's log-prob counts) or labels with -100 outside completions.")
    if tuple(mask.shape) != tuple(shape):
        raise PacksimError(f"completion_mask has shape {tuple(mask.shape)}, input_ids {tuple(shape)}: "
                           "give one entry per token of the same batch.")
    return mask


@leaves_no_trace
def audit_logprobs(model, batch: dict, *, completion_mask=None, seq=None, examples=None, names=None,
                   tol=None, trust_boundaries: bool = False, **forward_kwargs) -> LogprobReport:
    """Per-sequence summed completion log-probs under ``model(**batch, **forward_kwargs)`` vs each
    sequence alone. ``names``: one per sequence in token order (:func:`pair_names`, :func:`group_names`);
    ``tol``: per summed token (default ``LOGPROB_TOL`` by the dtype the forward computes in); ``seq`` (B, T) or ``examples``
    (each sequence's token ids, as the collator got them): where the sequences are, independently of
    the batch's fields; ``trust_boundaries``: the batch's fields are the ground truth. Returns a
    :class:`LogprobReport`.

    Example::

        >>> import packsim
        >>> model = packsim.build_model("tiny", seed=0)
        >>> batch = packsim.PackingCollator("correct", return_flash_attn_kwargs=True)(
        ...     [{"prompt_ids": [5, 6, 7], "response_ids": [8, 9, 10]}, {"prompt_ids": [11, 12], "response_ids": [13, 14]}])
        >>> packsim.audit_logprobs(model, batch, completion_mask=batch["labels"] != -100, trust_boundaries=True).status
        'isolated'
    """
    warn_outside()  # a transformers / TRL outside the tested window: one notice per process
    if not isinstance(batch, dict) or "input_ids" not in batch:
        raise PacksimError("audit_logprobs takes the collator's dict with input_ids (B, T) and the fields "
                           "the forward gets.")
    tol = given_tolerance(tol)
    found = find_boundaries(batch, missing="rows")  # input_ids (B, T) and every field checked first
    ids = batch["input_ids"]
    mask = _completion(batch if completion_mask is None else {"completion_mask": completion_mask}, ids.shape)
    fields = {k: v for k, v in batch.items() if k not in NON_MODEL_KEYS}
    findings, metadata_only = [], False
    if seq is not None:
        if tuple(torch.as_tensor(seq).shape) != tuple(ids.shape):
            raise PacksimError(f"seq has shape {tuple(torch.as_tensor(seq).shape)}, input_ids {tuple(ids.shape)}: "
                               "give each token's sequence index (-1 padding), one entry per token of the same batch.")
        source = "the seq given"
    else:  # the special tokens (or the examples given) locate the sequences, rows or no rows
        ev = dict_evidence(model, fields, examples)
        findings = [f for f in ev.findings if f.name == "boundary_fields"]
        if ev.seq is not None:
            seq, source = ev.seq, ev.source
        elif found.source.startswith(ROWS_SOURCE):  # no boundary field, no special token: one per row
            seq, source = found.seq_ids.clone(), found.source
        else:  # nothing independent: the batch's own fields (attention_mask 0 = padding, -1)
            seq, source = found.seq_ids.clone(), ev.source
            metadata_only = rests_on_metadata(findings)
    seq = torch.as_tensor(seq)
    kw = "".join(f", {k}={v!r}" for k, v in forward_kwargs.items())
    forward = f"model(**batch{kw}), batch keys {sorted(fields)}"
    first = torch.ones_like(seq, dtype=torch.bool)
    first[:, 1:] = seq[:, 1:] != seq[:, :-1]  # (B, T): a sequence's first token has no prefix in it
    counted = mask.to(seq.device) & ~first & (seq >= 0)  # (B, T)
    if not bool(counted.any()):
        return LogprobReport([], "not measured", str(torch.get_default_dtype()).split(".")[-1], forward,
                             "no completion token is counted (the completion mask marks none after a sequence's "
                             "first token): there is no log-prob to compare", source, findings)
    try:
        with torch.no_grad(), watch_dtypes(model) as seen:
            logits = model(**fields, **forward_kwargs).logits  # (B, T, V)
            computed = least_precise({*seen, logits.dtype})  # autocast: bf16 layers, float32 logits
            per_token = LOGPROB_TOL.get(computed, 1e-5) if tol is None else float(tol)
            packed = _next_token_logps(logits, ids) * counted  # (B, T)
            results = []
            order = [(b, int(e)) for b in range(seq.shape[0]) for e in dict.fromkeys(seq[b].tolist()) if e >= 0]
            if names is not None and len(names) != len(order):
                raise PacksimError(f"{len(names)} names for {len(order)} sequences: give one name per sequence.")
            for k, (b, e) in enumerate(order):
                where = seq[b] == e  # (T,)
                alone_ids = ids[b, where][None]  # (1, L)
                alone = _next_token_logps(model(input_ids=alone_ids, use_cache=False).logits, alone_ids)[0]
                n = int(counted[b, where].sum())
                results.append(SequenceLogprob(names[k] if names else f"sequence {k}",
                                               float(packed[b, where].sum()),
                                               float((alone * counted[b, where]).sum()), n, per_token * max(n, 1)))
    except ValueError as err:
        reason = needs_cuda_reason(err)
        if not reason:
            raise
        return LogprobReport([], "not measured", str(torch.get_default_dtype()).split(".")[-1], forward,
                             f"the forward refused the batch: {reason}", source, findings)
    status = "isolated" if all(s.ok for s in results) else "leaks"
    note = ""
    if status == "isolated" and any(f.failed for f in findings):
        status, note = "leaks", "the batch's boundary fields disagree with where the sequences are"
    elif status == "isolated" and metadata_only and not trust_boundaries:
        status = "unverified"
        note = ("isolated as the batch's own boundary fields mark the sequences, and nothing independent "
                "locates them (no examples given, and no BOS / EOS tokens that mark the same sequences): the verdict rests on the batch's own "
                "metadata, not a pass; pass examples= or trust_boundaries=True")
    return LogprobReport(results, status, str(logits.dtype).split(".")[-1], forward, note, source, findings,
                         str(computed).split(".")[-1], per_token)
