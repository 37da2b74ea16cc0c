"""The museum's pieces at scale: six public packing bugs of long-context and RL fine-tuning, each planted
on a tiny model, judged by packsim's own audit (FAIL, naming the probe or finding), its fix passing.

Every :class:`Piece` runs the audit itself (``run(buggy) -> Verdict``): the table's "caught by" is
the verdict's failed probes and findings, never a string written here. Pieces:

- ``ring_attention_ignores_documents`` (axolotl#3608): a context-parallel ring of 2 ranks over a
  packed row, in one process (:mod:`packsim.exhibits.cp_ring`), causal over the whole row (what
  torch's SDPA ring computes: ``is_causal``, no mask) vs masked by document; the step-0 losses of
  both ride in the verdict -> :func:`packsim.audit` (perturbation, gradient) and
  :func:`packsim.auditing.audit_context_parallel` on the ring's forward (the context_parallel finding);
- ``sdpa_ignores_cu_seqlens`` (AReaL#1442): ``cu_seq_lens_q/k`` handed to an sdpa forward, which
  never reads them -> :func:`packsim.audit_logprobs`;
- ``gated_deltanet_state_leak`` (NeMo Automodel#2147): a tiny Qwen3-Next (gated DeltaNet, then
  attention) packed without ``seq_idx`` / ``cu_seq_lens``, on packsim's reference kernels ->
  :func:`packsim.audit` (perturbation, gradient, the hybrid_state finding);
- ``num_items_minus_boundaries_twice`` (unsloth-zoo#1066): a ``num_items_in_batch`` smaller than
  the labels the loss counts -> ``audit_trainer``'s ``loss_over_accumulation``;
- ``roll_label_across_boundary`` (verl#6564): ``torch.roll(input_ids, -1)`` targets over a packed
  row -> ``loss_coverage`` (boundary tokens counted);
- ``grpo_padding_free_logprobs`` (trl#7087): TRL's own GRPO rows flattened padding-free, per-token
  log-probs computed without the boundaries -> :func:`packsim.audit_logprobs`.

Models: packsim's tiny Llama (vocab 48, seed 0; the GRPO piece: vocab of packsim's character
tokenizer), the hybrid frontier's tiny Qwen3-Next. Shapes: packed rows (1, N) of three examples
(8, 12, 8 tokens: [BOS] + prompt + response + [EOS]); per-token log-probs (N,); GRPO rows
(B, P + C) flattened to (1, N).

Lessons: A6.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from packsim.core.errors import PacksimError
from packsim.core.loss import IGNORE_INDEX
from packsim.core.token_example import TokenExample
from packsim.exhibits.museum_rows import MuseumTable

__all__ = ["PIECES_AT_SCALE", "Piece", "Verdict", "flatten_grpo_rows", "grpo_trainer", "museum_at_scale_table",
           "packed_trainer", "piece_row", "rolled_labels"]

VOCAB, BOS, EOS = 48, 1, 2
SHAPES = ((3, 3), (5, 5), (2, 4))  # (prompt body, response body): 8, 12 and 8 tokens with BOS / EOS


@dataclass(frozen=True)
class Verdict:
    """What the audit said: ``entry`` (which audit), ``status`` (its report's), the probes and
    findings that failed, the evidence in words, measured numbers, and the report itself."""

    entry: str
    status: str
    failed: tuple[str, ...]
    evidence: str
    measured: dict = field(default_factory=dict)
    report: object = field(default=None, compare=False, repr=False)

    @property
    def caught(self) -> bool:
        return bool(self.failed)

    @property
    def ok(self) -> bool:
        return not self.failed and self.status in ("pass", "isolated")

    @property
    def caught_by(self) -> str:
        return f"{self.entry}: FAIL ({', '.join(self.failed)})" if self.failed else "NOT CAUGHT"


@dataclass(frozen=True)
class Piece:
    """A public bug: ``story`` (what the thread says, then what is planted here), ``links``,
    ``expected`` (what must fail on the buggy pipeline), ``run(buggy) -> Verdict``."""

    name: str
    title: str
    links: tuple[str, ...]
    story: str
    expected: frozenset
    run: Callable[[bool], Verdict]


def _examples(shapes=SHAPES, seed: int = 0) -> list[TokenExample]:
    """[BOS] + prompt + response + [EOS] per shape, seeded; the first ``n_prompt`` the prompt."""
    rng = random.Random(seed)
    out = []
    for n_prompt, n_response in shapes:
        body = [rng.randrange(3, VOCAB) for _ in range(n_prompt + n_response)]
        out.append(TokenExample(tuple([BOS] + body + [EOS]), 1 + n_prompt))
    return out


def _flat(exs, labels: bool = True) -> dict:
    """``DataCollatorWithFlattening(return_flash_attn_kwargs=True)`` over ``exs`` with completion-only
    labels (prompts -100): input_ids, labels, position_ids (1, N), cu_seq_lens_q/k (S+1,),
    max_length_q/k; completion_mask (1, N) True on responses and EOS (``labels=False``: no labels)."""
    from transformers import DataCollatorWithFlattening

    feats = [{"input_ids": list(e.tokens), "labels": [IGNORE_INDEX] * e.n_prompt + list(e.tokens[e.n_prompt:])}
             for e in exs]
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=True)(feats)
    if not labels:
        del batch["labels"]
    batch["completion_mask"] = torch.tensor([t >= e.n_prompt for e in exs for t in range(len(e.tokens))])[None]
    return batch


def _seq(exs) -> torch.Tensor:
    """(1, N): the example index of each token."""
    return torch.cat([torch.full((len(e.tokens),), k) for k, e in enumerate(exs)])[None]


def _tiny(impl: str, fresh: bool = False):
    """packsim's tiny Llama (vocab 48, seed 0) on ``impl``: shared and read-only, or ``fresh`` (its own)."""
    from packsim.core.model import build_model, shared_model

    if fresh:
        return build_model("tiny", vocab_size=VOCAB, attn_implementation=impl, seed=0)
    return shared_model(build_model, "tiny", vocab_size=VOCAB, attn_implementation=impl, seed=0)


def _audit_verdict(report, entry: str = "packsim.audit", show: str = "perturbation", **measured) -> Verdict:
    """A report of :func:`packsim.audit` / ``audit_trainer`` as a Verdict: the evidence is the first
    failed probe's summary (else the first failed finding's), or on a pass the ``show`` probe's."""
    failed = [report.probes[n].summary for n in report.failed if n in report.probes]
    failed += [f.evidence for f in report.findings if f.failed]
    shown = report.probes[show].summary if show in report.probes else report.status
    evidence = failed[0] if failed else f"{report.status}: {shown}"
    return Verdict(entry, report.status, tuple(report.failed), evidence[:400], measured, report)


def _logprob_verdict(report, **measured) -> Verdict:
    w = report.worst
    evidence = (f"{report.status}: worst {w.name}, summed log-prob {w.packed:.4f} packed vs {w.alone:.4f} alone "
                f"(change {w.change:.2e}, tolerance {w.tol:.0e})" if w else report.text())
    failed = ("log-prob isolation",) if report.status == "leaks" else ()
    return Verdict("audit_logprobs", report.status, failed, evidence, measured, report)


# ----------------------------------------------------------------------------- axolotl#3608


def _ring(buggy: bool) -> Verdict:
    """packsim.audit on the row (every probe), then audit_context_parallel on the ring's forward (its
    ``context_parallel`` finding: each document's logits through the ring against it alone)."""
    from packsim.auditing.auditor import audit
    from packsim.auditing.context_parallel import audit_context_parallel
    from packsim.exhibits.cp_ring import on_ring, step0_losses

    exs = _examples()
    batch = _flat(exs)
    model = _tiny("sdpa", fresh=True)  # its attention is switched to the rings
    losses = step0_losses(model, batch)
    fields = {k: v for k, v in batch.items() if k != "completion_mask"}
    ids, pos = fields["input_ids"], fields["position_ids"]  # (1, N)
    with on_ring(model, documents=not buggy):
        report = audit(model, fields, batch["completion_mask"], examples=[list(e.tokens) for e in exs],
                       use_cache=False)
        cp = audit_context_parallel(model, lambda x: model(input_ids=x, position_ids=pos, use_cache=False).logits,
                                    ids, [len(e.tokens) for e in exs], torch.arange(ids.shape[1]),
                                    position_ids=pos)
    verdict = _audit_verdict(report, **{f"step0_loss_{k}": v for k, v in losses.items()})
    found = [f for f in cp.findings if f.name == "context_parallel"]
    failed = verdict.failed + tuple(f.name for f in found if f.failed)
    evidence = verdict.evidence if not failed else "; ".join([verdict.evidence, *(f.evidence for f in found if f.failed)])
    status = "fail" if failed else verdict.status
    return Verdict("packsim.audit + audit_context_parallel", status, failed, evidence[:600], verdict.measured, report)


# ----------------------------------------------------------------------------- AReaL#1442


def _sdpa_cu_seqlens(buggy: bool) -> Verdict:
    from packsim.auditing.logprobs import audit_logprobs

    exs = _examples(seed=1)
    batch = _flat(exs, labels=False)
    if buggy:  # the varlen fields only: sdpa reads none of them
        del batch["position_ids"]
    report = audit_logprobs(_tiny("sdpa"), batch, examples=[list(e.tokens) for e in exs], use_cache=False)
    return _logprob_verdict(report)


# ----------------------------------------------------------------------------- NeMo Automodel#2147


def _deltanet(buggy: bool) -> Verdict:
    from packsim.auditing.auditor import audit
    from packsim.core.model import shared_model
    from packsim.exhibits.hybrid_traps import build_frontier, frontier_batch
    from packsim.reference.hybrid_emulation import emulate_hybrid_kernels, kernels_in_use

    model = shared_model(build_frontier, "qwen3_next")
    batch, seq = frontier_batch("positions" if buggy else "seq_idx_cu_seq_lens")
    parts = [batch["input_ids"][0, seq[0] == k].tolist() for k in range(int(seq.max()) + 1)]
    with emulate_hybrid_kernels():  # a real causal_conv1d / fla wins where installed
        kernels = kernels_in_use(model)
        report = audit(model, batch, examples=parts, use_cache=False)
    return _audit_verdict(report, delta_rule_kernel=kernels.get("chunk_gated_delta_rule", "?"),
                          conv_kernel=kernels.get("causal_conv1d_fn", "?"))


# ----------------------------------------------------------------------------- unsloth-zoo#1066


def packed_trainer(buggy: bool):
    """A transformers ``Trainer`` on packsim's tiny Llama packing four rows with
    ``DataCollatorWithFlattening`` (one step, CPU); ``buggy``: its ``num_items_in_batch`` subtracts
    the packed boundaries again from transformers' own count (which already leaves them out)."""
    import tempfile

    import datasets
    from transformers import DataCollatorWithFlattening, Trainer, TrainingArguments

    class BoundariesTwice(Trainer):
        def _get_num_items_in_batch(self, batch_samples, device):
            count = super()._get_num_items_in_batch(batch_samples, device)  # labels[..., 1:] != -100
            starts = sum(int((b["position_ids"][..., 1:] == 0).sum()) for b in batch_samples)
            return count - starts  # the boundaries, already -100 in the labels, subtracted once more

    rows = [list(e.tokens) for e in _examples(((3, 2), (4, 3), (2, 2), (3, 3)), seed=3)]
    args = TrainingArguments(output_dir=tempfile.mkdtemp(prefix="packsim-museum-"), per_device_train_batch_size=4,
                             max_steps=1, report_to="none", use_cpu=True, save_strategy="no", seed=0)
    cls = BoundariesTwice if buggy else Trainer
    return cls(model=_tiny("sdpa", fresh=True), args=args, train_dataset=datasets.Dataset.from_dict({"input_ids": rows}),
               data_collator=DataCollatorWithFlattening())


def _num_items(buggy: bool) -> Verdict:
    from packsim.auditing.trainer import audit_trainer

    report = audit_trainer(packed_trainer(buggy), objective="lm")
    finding = next(f for f in report.findings if f.name == "loss_over_accumulation")
    return Verdict("audit_trainer", report.status, tuple(report.failed), finding.evidence[:400], {}, report)


# ----------------------------------------------------------------------------- verl#6564


def rolled_labels(input_ids: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """Targets by ``torch.roll(input_ids, -1)`` over a packed row (N,) -> labels (1, N) in the
    convention the audit and transformers' loss read (the target of the logits at t sits at t + 1;
    position 0 is -100). With ``cu_seqlens`` (S+1,) (the fix), each sequence's last token predicts
    nothing. The row's last token's rolled target (the row's first token) has no place in (1, N)
    labels of that convention, so it is dropped here either way."""
    targets = torch.roll(input_ids, shifts=-1, dims=0)  # (N,): targets[t] = input_ids[t + 1]
    keep = torch.ones_like(input_ids, dtype=torch.bool)
    if cu_seqlens is not None:
        keep[cu_seqlens[1:].long() - 1] = False
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    labels[1:] = torch.where(keep[:-1], targets[:-1], IGNORE_INDEX)
    return labels[None]


def _roll_label(buggy: bool) -> Verdict:
    from packsim.auditing.auditor import audit

    exs = _examples(seed=2)
    batch = _flat(exs)
    batch["labels"] = rolled_labels(batch["input_ids"][0], None if buggy else batch["cu_seq_lens_q"])
    fields = {k: v for k, v in batch.items() if k != "completion_mask"}
    report = audit(_tiny("sdpa"), fields, examples=[list(e.tokens) for e in exs], objective="lm", use_cache=False)
    return _audit_verdict(report, show="loss_coverage")


# ----------------------------------------------------------------------------- trl#7087


def grpo_trainer():
    """TRL's ``GRPOTrainer`` on packsim's tiny Llama and character tokenizer: 2 prompts x 2 generations,
    completions of up to 6 tokens, a local length reward (CPU)."""
    import copy
    import tempfile

    import datasets
    import trl

    from packsim.core.model import build_model
    from packsim.core.tokenizer import build_tokenizer

    tok = copy.deepcopy(build_tokenizer())  # TRL may set fields on it
    args = trl.GRPOConfig(output_dir=tempfile.mkdtemp(prefix="packsim-grpo-"), per_device_train_batch_size=4,
                          num_generations=2, max_completion_length=6, max_steps=1, report_to="none",
                          save_strategy="no", use_cpu=True, bf16=False, seed=0)
    return trl.GRPOTrainer(model=build_model("tiny", vocab_size=len(tok), attn_implementation="sdpa"),
                           reward_funcs=lambda completions, **kw: [float(len(c)) for c in completions], args=args,
                           train_dataset=datasets.Dataset.from_dict({"prompt": ["hello there", "how are you"]}),
                           processing_class=tok)


def flatten_grpo_rows(rows: dict, boundaries: bool) -> tuple[dict, torch.Tensor]:
    """The padded rows (B, P + C) of :func:`packsim.auditing.grpo.grpo_rows` flattened padding-free:
    every row's real tokens in one row (1, N) with its completion_mask; ``boundaries``: position_ids
    restarting per completion. -> (batch, seq (1, N): the row each token came from)."""
    real = rows["attention_mask"].bool()
    parts = [rows["input_ids"][b, real[b]] for b in range(real.shape[0])]
    batch = {"input_ids": torch.cat(parts)[None],
             "completion_mask": torch.cat([rows["completion_mask"][b, real[b]] for b in range(real.shape[0])])[None]}
    if boundaries:
        batch["position_ids"] = torch.cat([torch.arange(len(p)) for p in parts])[None]
    return batch, torch.cat([torch.full((len(p),), b) for b, p in enumerate(parts)])[None]


def _grpo(buggy: bool) -> Verdict:
    from packsim.auditing.grpo import grpo_rows
    from packsim.auditing.logprobs import audit_logprobs, group_names

    trainer = grpo_trainer()
    batch, seq = flatten_grpo_rows(grpo_rows(trainer), boundaries=not buggy)
    size = trainer.args.num_generations
    names = group_names(int(seq.max() + 1) // size, size)
    # seq: where TRL put each completion (one per row); a generated token may be a BOS / EOS id
    report = audit_logprobs(trainer.model.eval(), batch, seq=seq, names=names, use_cache=False)
    return _logprob_verdict(report)


# ----------------------------------------------------------------------------- the pieces

_GH = "https://github.com"
PIECES_AT_SCALE = {p.name: p for p in [
    Piece("ring_attention_ignores_documents", "Ring attention over packed documents, causal across the row",
          (f"{_GH}/axolotl-ai-cloud/axolotl/issues/3608",),
          "Reported: ring attention (context parallelism) with document packing gave 1.84x the step-0 loss. "
          "Planted here in one process: a ring of 2 ranks over a packed row of three documents whose blocks "
          "are masked causal by position only, as torch's SDPA ring computes (it takes is_causal and refuses an "
          "attn_bias), so documents attend across each other, within a shard and across shard boundaries. "
          "Fix here: the ring masks by document as well (the documents read from the restarting position_ids). "
          "The step-0 loss ratio of the tiny random model is printed; its weights are random, so it is not the "
          "report's ratio.",
          frozenset({"perturbation", "gradient", "context_parallel"}), _ring),
    Piece("sdpa_ignores_cu_seqlens", "cu_seqlens handed to an sdpa forward in packed RL log-probs",
          (f"{_GH}/inclusionAI/AReaL/issues/1442",),
          "Reported: sdpa ignores cu_seqlens in packed RL log-probs. Planted here: a packed row with "
          "cu_seq_lens_q/k and max_length_q/k but no position_ids, on transformers' sdpa, which reads none of "
          "the varlen fields (it builds a packed mask from restarting position_ids only), so every sequence's "
          "per-token log-probs see the sequences before it. Fix here: position_ids restarting per sequence "
          "(or an implementation that reads cu_seq_lens, e.g. the flash path).",
          frozenset({"log-prob isolation"}), _sdpa_cu_seqlens),
    Piece("gated_deltanet_state_leak", "Gated DeltaNet packed without cu_seqlens or seq_idx",
          (f"{_GH}/NVIDIA-NeMo/Automodel/issues/2147",),
          "Reported: a gated DeltaNet leaked recurrent state across packed sequences: the FLA kernel without "
          "cu_seqlens, the conv without seq_idx. Planted here on a tiny Qwen3-Next (a gated DeltaNet layer, "
          "then attention) with position_ids only, on packsim's reference kernels where transformers looks "
          "for causal_conv1d and fla (a real package wins). Fix here: seq_idx for the conv and cu_seq_lens_q/k "
          "for the gated delta rule (what TRL's padding-free collator gives).",
          frozenset({"perturbation", "gradient", "hybrid_state"}), _deltanet),
    Piece("num_items_minus_boundaries_twice", "num_items_in_batch with the packed boundaries subtracted twice",
          (f"{_GH}/unslothai/unsloth-zoo/issues/1066",),
          "Reported: num_items_in_batch subtracted the packed boundaries twice, so the summed loss was "
          "divided by fewer labels than it counts. Planted here: a transformers Trainer over "
          "DataCollatorWithFlattening rows (whose boundary labels are already -100) whose count subtracts "
          "the boundaries once more. Fix here: transformers' own count (labels[..., 1:] != -100).",
          frozenset({"loss_over_accumulation"}), _num_items),
    Piece("roll_label_across_boundary", "torch.roll targets across a packed boundary",
          (f"{_GH}/volcengine/verl/issues/6564",),
          "Reported: labels made with torch.roll over a packed row, so the last token of each sequence is "
          "trained to predict the next sequence's first token. Planted here with torch.roll(input_ids, -1) "
          "over a row of three sequences (the targets written in the shifting label convention the audit "
          "reads). Fix here: no target at each sequence's last token (cu_seqlens).",
          frozenset({"loss_coverage"}), _roll_label),
    Piece("grpo_padding_free_logprobs", "Padding-free GRPO log-probs computed without the boundaries",
          (f"{_GH}/huggingface/trl/issues/7087",),
          "Reported: padding-free GRPO log-probs. Planted here on TRL's own GRPOTrainer (CPU, its own "
          "generated completions): the padded rows it feeds its model, flattened padding-free into one row "
          "with the padding removed, per-token log-probs computed on it without the boundaries. Fix here: "
          "position_ids restarting per completion, which transformers' sdpa turns into a per-sequence mask.",
          frozenset({"log-prob isolation"}), _grpo),
]}


def piece_row(piece: Piece) -> tuple[str, str, str, str, bool]:
    """The piece run buggy and fixed -> its museum-table row (name, title, link, caught by, fix passes)."""
    bug, fixed = piece.run(True), piece.run(False)
    return piece.name, piece.title, piece.links[0], bug.caught_by, fixed.ok


def museum_at_scale_table(names=None) -> MuseumTable:
    """Run every piece at scale (or ``names``) buggy and fixed -> :class:`~packsim.exhibits.museum_rows.MuseumTable`."""
    chosen = list(PIECES_AT_SCALE) if names is None else list(names)
    unknown = [n for n in chosen if n not in PIECES_AT_SCALE]
    if unknown:
        raise PacksimError(f"unknown piece(s) {unknown}: use some of {list(PIECES_AT_SCALE)}.")
    return MuseumTable([piece_row(PIECES_AT_SCALE[n]) for n in chosen])
