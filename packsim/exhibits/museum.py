"""A museum of real-world packing bugs: each one planted on the tiny model, each one caught.

Every :class:`Exhibit` is a bug users reported in a public tracker, rebuilt as a planted fault on
packsim's tiny Llama (``build_model("tiny")``, vocab 48, fp32, CPU): the buggy pipeline (model +
batch + forward kwargs, or the loss reduction), the fixed one, and what catches it. Most are caught
by :func:`packsim.audit` (perturbation, gradient, attention_mass, loss_coverage); two are not
visible in one batch's probes and are caught by the museum's checks (:mod:`packsim.auditing.loss_checks`):

- :func:`check_counted_labels`: a batch whose labels are all -100 (the loss is 0/0);
- :func:`check_loss_normalisation`: every counted token must weigh 1/N (N: the step's counted
  tokens) in the loss summed over the micro-batches of one optimizer step (gradient accumulation).

Batches are transformers' ``DataCollatorWithFlattening`` rows (1, N) (``input_ids``, ``labels``,
``position_ids``, ``cu_seq_lens_q/k``) unless the story says otherwise; ``response_mask`` (1, N) is
True on response tokens and the final EOS (:func:`packsim.auditing.features.response_mask_from_features`).
Every link was checked against the stored public thread; the stories are ours. ``AUDITED`` holds
these exhibits; ``EXHIBITS`` holds them, the pieces beyond SFT of :mod:`packsim.exhibits.museum_beyond_sft`
(each checked by its own probe) and the pieces at scale of :mod:`packsim.exhibits.museum_at_scale` (each judged
by the audit it names). :func:`museum_table` runs every one (buggy and fixed) and tabulates
what caught it. For lesson 07 and docs/audit.md; tests/test_museum.py runs every exhibit.

Lessons: A6.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from unittest import mock

import torch

from packsim.auditing.auditor import audit
from packsim.auditing.features import response_mask_from_features
from packsim.auditing.loss_checks import (
    check_counted_labels,
    check_loss_normalisation,
    global_token_mean,
    mean_of_means,
)
from packsim.auditing.report import PROBES, AuditReport
from packsim.core.errors import PacksimError
from packsim.core.loss import IGNORE_INDEX
from packsim.core.token_example import TokenExample
from packsim.exhibits.museum_at_scale import PIECES_AT_SCALE, Piece, piece_row
from packsim.exhibits.museum_beyond_sft import PUBLIC_BUGS, PublicBug, public_bug_row
from packsim.exhibits.museum_rows import MuseumTable

VOCAB, BOS, EOS = 48, 1, 2
SHAPES = ((4, 3), (5, 4), (3, 5))  # (prompt body, response body) per example


def examples(chat: bool = False, shapes=SHAPES, seed: int = 0) -> list[TokenExample]:
    """Seeded toy examples: ``tokens`` = [BOS] + prompt + response + [EOS], the first ``n_prompt``
    the prompt; ``chat`` ends the user turn with an EOS (end of turn) as well."""
    rng = random.Random(seed)
    out = []
    for n_prompt, n_response in shapes:
        prompt = [BOS] + [rng.randrange(3, VOCAB) for _ in range(n_prompt)] + ([EOS] if chat else [])
        out.append(TokenExample(tuple(prompt + [rng.randrange(3, VOCAB) for _ in range(n_response)] + [EOS]),
                                len(prompt)))
    return out


def collate(exs, labels: str = "completion") -> dict:
    """``DataCollatorWithFlattening`` over ``exs``: labels "completion" (prompt -100) or "all"."""
    from transformers import DataCollatorWithFlattening

    feats = []
    for ex in exs:
        lab = list(ex.tokens) if labels == "all" else [IGNORE_INDEX] * ex.n_prompt + list(ex.tokens[ex.n_prompt:])
        feats.append({"input_ids": list(ex.tokens), "labels": lab})
    return DataCollatorWithFlattening(return_flash_attn_kwargs=True)(feats)


def tiny_llama(impl: str = "sdpa"):
    """The shared tiny Llama per attention implementation (same weights; never mutated here)."""
    from packsim.core.model import build_model, shared_model

    return shared_model(build_model, "tiny", vocab_size=VOCAB, attn_implementation=impl, seed=0)


# ----------------------------------------------------------------------------- exhibits


@dataclass
class Case:
    """One pipeline: ``audit(model, batch, **kwargs)`` inside ``context()``; optional micro-batches."""

    model: object
    batch: object
    kwargs: dict
    context: Callable = nullcontext
    micro_batches: list | None = None
    accumulate: Callable | None = None


@dataclass(frozen=True)
class Exhibit:
    """A bug from a public tracker: ``story`` (symptom, cause, fix), ``links``, ``build(buggy)``.

    ``expected``: the probes/checks that fail on the buggy pipeline (and pass when fixed);
    ``evidence``: text the first failing probe's or check's summary must contain.
    """

    name: str
    title: str
    links: tuple[str, ...]
    story: str
    build: Callable[[bool], Case]
    expected: frozenset
    evidence: str = ""


def audit_exhibit(exhibit: Exhibit | str, fixed: bool = False) -> AuditReport:
    """Audit the buggy (or fixed) pipeline of ``exhibit``; the museum's checks join ``report.findings``.

    ``report.failed`` then names the failed probes and checks (``counted_labels`` for dict batches,
    ``equal_token_weights`` where the exhibit accumulates micro-batches).
    """
    if isinstance(exhibit, str) and exhibit in {**PUBLIC_BUGS, **PIECES_AT_SCALE} or isinstance(exhibit, PublicBug | Piece):
        name = exhibit if isinstance(exhibit, str) else exhibit.name
        raise PacksimError(f"{name!r} is a newer piece checked by its own probe, not by one audit: "
                           f"run EXHIBITS[{name!r}].run(buggy) or museum_table([{name!r}]).")
    if isinstance(exhibit, str) and exhibit not in AUDITED:
        raise PacksimError(f"unknown exhibit {exhibit!r}: use one of {list(AUDITED)}.")
    ex = AUDITED[exhibit] if isinstance(exhibit, str) else exhibit
    case = ex.build(not fixed)
    with case.context():
        report = audit(case.model, case.batch, **case.kwargs)
        if isinstance(case.batch, dict):
            report.findings.append(check_counted_labels(case.batch))
        if case.micro_batches:
            report.findings.append(check_loss_normalisation(case.model, case.micro_batches, case.accumulate))
    return report


def _dict_case(batch: dict, exs, impl: str = "sdpa", **kwargs) -> Case:
    kwargs.setdefault("use_cache", False)
    return Case(tiny_llama(impl), batch, {"response_mask": response_mask_from_features(exs), **kwargs})


@contextmanager
def _no_packed_detection():
    """transformers before PR 39194: eager/sdpa/flex never derive a packed mask from position_ids."""
    import transformers.masking_utils as hf_masking

    with mock.patch.object(hf_masking, "find_packed_sequence_indices", lambda position_ids: None):
        yield


def _example_ids(exs, first: int = 0) -> torch.Tensor:
    """(1, N): the example index of each token, counting from ``first``."""
    return torch.cat([torch.full((len(e.tokens),), i + first) for i, e in enumerate(exs)])[None]


def _eos_only(buggy: bool) -> Case:
    exs = examples()
    batch = collate(exs)
    if buggy:  # concatenated with EOS between examples, positions 0..N-1, one causal mask
        batch = {"input_ids": batch["input_ids"], "labels": batch["labels"], "seq_idx": _example_ids(exs)}
    return _dict_case(batch, exs, "eager")


def _no_detection(buggy: bool) -> Case:
    exs = examples()
    case = _dict_case(collate(exs), exs, "sdpa")
    case.context = _no_packed_detection if buggy else nullcontext
    return case


def _mask_case(kind: str) -> Callable[[bool], Case]:
    """A 2D attention_mask next to packed position_ids: all ones (sdpa) or segment ids 1, 2, 3 (eager)."""

    def build(buggy: bool) -> Case:
        exs = examples()
        batch = collate(exs)
        if buggy:
            ones = torch.ones_like(batch["input_ids"])
            batch["attention_mask"] = ones if kind == "ones" else _example_ids(exs, first=1)
        return _dict_case(batch, exs, "sdpa" if kind == "ones" else "eager")

    return build


def _cache(buggy: bool) -> Case:
    exs = examples()
    if not buggy:
        return _dict_case(collate(exs), exs, "sdpa")
    from packsim.core.model import build_model

    model = build_model("tiny", vocab_size=VOCAB, attn_implementation="sdpa", seed=0).train()
    model.config.use_cache = True  # a hand-built config's default; no use_cache in the call
    return Case(model, collate(exs), {"response_mask": response_mask_from_features(exs)})


def _positions_only(buggy: bool) -> Case:
    from packsim.core.batch import PackedBatch
    from packsim.core.setups import Setup

    exs = examples()
    setup = Setup("causal", "reset", "completion") if buggy else "correct"
    batch = PackedBatch.from_examples(exs, capacity=sum(len(e.tokens) for e in exs), setup=setup,
                                      strategy="sequential")
    return Case(tiny_llama("packsim"), batch, {})


def _boundary_label(buggy: bool) -> Case:
    exs = examples()
    batch = collate(exs)
    if buggy:  # plain concatenation: each example's first token is a target of the previous one
        starts = batch["cu_seq_lens_q"][1:-1].long()
        batch["labels"][0, starts] = batch["input_ids"][0, starts]
    return _dict_case(batch, exs)


def _end_of_turn(buggy: bool) -> Case:
    exs = examples(chat=True)
    batch = collate(exs)
    if buggy:  # the counted span ends at the FIRST EOS (end of the user turn), not the last
        labels = []
        for e in exs:
            end = e.tokens.index(EOS) + 1
            labels += [IGNORE_INDEX] + list(e.tokens[1:end]) + [IGNORE_INDEX] * (len(e.tokens) - end)
        batch["labels"] = torch.tensor(labels)[None]
    return _dict_case(batch, exs)


def _no_response(buggy: bool) -> Case:
    max_length = 4 if buggy else 32  # truncation keeps the first max_length tokens of each example
    exs = [TokenExample(e.tokens[:max_length], min(e.n_prompt, max_length)) for e in examples()]
    return _dict_case(collate(exs), exs)


def _prompt_in_loss(buggy: bool) -> Case:
    exs = examples(chat=True)
    return _dict_case(collate(exs, "all" if buggy else "completion"), exs)


def _accumulation(buggy: bool) -> Case:
    short = examples(shapes=((6, 1),), seed=1)  # 2 counted tokens
    long = examples(shapes=((2, 9), (3, 8)), seed=2)  # 19 counted tokens
    micro = [collate(short), collate(long)]
    case = _dict_case(micro[1], long)
    case.micro_batches = micro
    case.accumulate = mean_of_means if buggy else global_token_mean
    return case


_LEAK, _LEAK_SDPA = frozenset(("perturbation", "gradient", "attention_mass")), frozenset(("perturbation", "gradient"))
_TRL, _HF = "https://github.com/huggingface/trl", "https://github.com/huggingface/transformers"
AUDITED = {e.name: e for e in [
    Exhibit("trl_eos_only_packing", "TRL's early packing: EOS between examples, one causal mask",
            (f"{_TRL}/issues/805", f"{_TRL}/issues/3067"),
            "A user asked whether packed SFT examples can see each other when only an EOS separates "
            "them; the answer at the time was that EOS is enough signal, and a maintainer later "
            "confirmed the mask stays triangular so samples can contaminate. Cause: examples "
            "concatenated into one row with positions 0..N-1 and no mask, so every example attends "
            "to all earlier ones. Fix: TRL's BFD packing turns padding-free on (position_ids restart "
            "per example). Here seq_idx is in the batch only so the audit knows where examples are.",
            _eos_only, _LEAK, "leaking pairs"),
    Exhibit("padding_free_without_packed_mask", "Padding-free rows on sdpa/eager before transformers built a packed mask",
            (f"{_TRL}/issues/2834", f"{_HF}/pull/39194"),
            "Padding-free training started with a much higher loss; the reply was that padding-free "
            "only worked with FlashAttention. Cause: until transformers PR 39194 eager/sdpa/flex never "
            "turned restarting position_ids into a block-diagonal mask, so the flattened row was one "
            "causal sequence. Planted by switching transformers' packed-sequence detection off. Fix: "
            "a flash implementation, or a transformers release with that PR (the installed one has it).",
            _no_detection, _LEAK_SDPA, "leaking pairs"),
    Exhibit("all_ones_mask", "An all-ones attention_mask next to packed position_ids",
            (f"{_HF}/pull/46634",),
            "Loss still went down, so nobody noticed: the packed row leaked on sdpa. Cause: "
            "transformers derives the packed mask from position_ids only when attention_mask is None; "
            "a 2D mask of ones turns detection off and sdpa takes the plain causal path. The PR to "
            "drop that condition was closed. Fix: send no attention_mask with a padding-free batch.",
            _mask_case("ones"), _LEAK_SDPA, "leaking pairs"),
    Exhibit("segment_id_mask", "Multipack's segment-id attention_mask on sdpa/eager",
            ("https://github.com/axolotl-ai-cloud/axolotl/pull/3796",),
            "Axolotl's sample packing leaked across documents on sdpa/eager and only warned. Cause: "
            "its collator writes segment ids 1, 2, 3... into attention_mask; modern transformers casts "
            "it to bool (all True), which also turns packed-sequence detection off. Fix: drop the "
            "mask on those backends so isolation comes from position_ids.",
            _mask_case("segments"), _LEAK, "leaking pairs"),
    Exhibit("cache_during_training", "A cache built during training (use_cache from the config)",
            (f"{_HF}/pull/46634", f"{_TRL}/issues/2834"),
            "Not a thread of its own: the gate quoted in transformers PR 46634 also requires no cache, "
            "and the training recipe in TRL issue 2834 passes use_cache=True unless gradient "
            "checkpointing is on. Cause: a model in train mode still builds a DynamicCache when "
            "use_cache is true (a hand-built config's default), and with a cache transformers skips "
            "packed-sequence detection. Fix: use_cache=False in the config or the call.",
            _cache, _LEAK_SDPA, "leaking pairs"),
    Exhibit("positions_reset_without_mask", "Positions reset per example, mask still causal over the pack",
            ("https://github.com/huggingface/nanoVLM/pull/204", "https://github.com/DeepOpt-com/WrinkleFree-Monorepo/issues/53"),
            "Two projects reset position ids per packed document and believed them isolated; "
            "changing document 1 still moved document 2's logits (by up to 11.34 in one report). "
            "Cause: positions only feed RoPE; the attention mask was still one causal triangle over "
            "the row. Fix: a document-aware (block-diagonal) mask as well.",
            _positions_only, _LEAK, "leaking pairs"),
    Exhibit("boundary_label", "One example's last token trained to predict the next example's first",
            ("https://github.com/meta-pytorch/torchtune/issues/1177", f"{_HF}/pull/31629"),
            "A user noticed that in a packed row the EOS of one sequence is trained to predict the "
            "BOS of the next. Cause: labels copied from the concatenated input_ids. Fix: -100 on the "
            "first label of every example, as DataCollatorWithFlattening does since it was added.",
            _boundary_label, frozenset({"loss_coverage"}), "boundary token(s) counted"),
    Exhibit("end_of_turn_index", "End-of-turn index taken for the end of the sequence",
            ("https://github.com/NVIDIA-NeMo/Speech/pull/14437",),
            "NeMo's packed fine-tuning loss was 5.29 against 3.66 unpacked on one tiny chat example. "
            "Cause: the code meant to find where each sequence ends took the first EOS, which in a "
            "chat template ends the user's turn, not the conversation. Planted here in the span the "
            "loss counts: it stops at the end of the turn, so the prompt is trained and the reply is "
            "not. Fix: take the last EOS (the end of the sequence).",
            _end_of_turn, frozenset({"loss_coverage"}), "response token(s) not counted"),
    Exhibit("pack_without_response_tokens", "A pack whose examples have no response tokens left",
            (f"{_TRL}/pull/6671",),
            "Training reported a loss of 0.0 and looked fine. Cause: with completion-only loss, a "
            "max_length shorter than the prompts truncated every completion away, so every label in "
            "the batch was -100 and the mean loss was 0/0. Fix: raise max_length or drop prompt-only "
            "examples; the PR proposes a warning when a batch counts no label. Caught by the museum's "
            "counted_labels check: the audit's probes see nothing wrong with any single token.",
            _no_response, frozenset({"counted_labels", "loss_coverage"}), "no label is counted"),
    Exhibit("prompt_in_loss_chat_template", "Prompt tokens counted when packing a chat template",
            (f"{_TRL}/issues/3728",),
            "After SFT with packing the model kept emitting the turn-start token. Cause: "
            "assistant_only_loss was ignored with packing=True, so system, user and template tokens "
            "were trained as targets. Fix: keep the assistant mask through packing (labels -100 "
            "outside the assistant's replies).",
            _prompt_in_loss, frozenset({"loss_coverage"}), "prompt token(s) counted"),
    Exhibit("mean_of_micro_batch_means", "A mean of per-micro-batch means under gradient accumulation",
            (f"{_HF}/pull/34191", "https://github.com/meta-pytorch/torchtune/pull/1875"),
            "Losses with gradient accumulation did not match the same run without it. Cause: each "
            "micro-batch's loss was a mean over its own tokens and the means were averaged, so a "
            "token in a short micro-batch weighed more: (x1/n1 + x2/n2)/2 != (x1+x2)/(n1+n2). Packing "
            "makes counts vary more. Fix: sum the token losses and divide by the step's counted "
            "tokens (num_items_in_batch). Caught by the museum's equal_token_weights check.",
            _accumulation, frozenset({"equal_token_weights"}), "max/min"),
]}


# ----------------------------------------------------------------------------- the table


def _caught_by(report: AuditReport) -> str:
    probes = [name for name in report.failed if name in PROBES]
    checks = [name for name in report.failed if name not in PROBES]
    parts = [f"audit: {', '.join(probes)}"] * bool(probes) + [f"museum check: {', '.join(checks)}"] * bool(checks)
    return "; ".join(parts) or "NOT CAUGHT"


# every bug of the museum: the audited exhibits above, the pieces beyond SFT (each checked by its own
# probe: PublicBug.run(buggy) -> (caught, evidence)), then the pieces at scale (Piece.run(buggy) -> Verdict)
EXHIBITS: dict[str, Exhibit | PublicBug | Piece] = {**AUDITED, **PUBLIC_BUGS, **PIECES_AT_SCALE}


def museum_table(names=None) -> MuseumTable:
    """Run every exhibit and piece (or ``names``), buggy and fixed, and tabulate what caught each bug."""
    chosen = list(EXHIBITS) if names is None else list(names)
    unknown = [n for n in chosen if n not in EXHIBITS]
    if unknown:
        raise PacksimError(f"unknown exhibit(s) {unknown}: use some of {list(EXHIBITS)}.")
    rows = []
    for name in chosen:
        if name in PUBLIC_BUGS or name in PIECES_AT_SCALE:
            rows.append(public_bug_row(PUBLIC_BUGS[name]) if name in PUBLIC_BUGS else piece_row(PIECES_AT_SCALE[name]))
            continue
        bug, fixed = audit_exhibit(name), audit_exhibit(name, fixed=True)
        rows.append((name, EXHIBITS[name].title, EXHIBITS[name].links[0], _caught_by(bug), not fixed.failed))
    return MuseumTable(rows)


__all__ = ["AUDITED", "EXHIBITS", "Case", "Exhibit", "MuseumTable", "audit_exhibit", "museum_table"]
