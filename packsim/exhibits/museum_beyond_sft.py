"""Museum pieces beyond SFT: public packing bugs on attention-only decoders, each planted
on a tiny model (or the data path it lives in), caught by a probe, and its fix passing.

Each :class:`PublicBug` has a story (only what the linked thread or the installed code says), the
link (checked against the stored public thread), the probe that catches it, and ``run(buggy)``
-> (caught, evidence). :func:`museum_beyond_sft_table` runs every piece buggy and fixed and returns a
:class:`~packsim.exhibits.museum_rows.MuseumTable` (the same table lesson 07 prints for the older
exhibits); ``PUBLIC_BUGS`` maps each name to its piece, and ``museum.EXHIBITS`` holds every piece too.
Pieces:

- ``label_roll_across_boundary``: labels made with ``torch.roll`` over a packed 1D row;
- ``mrope_3d_taken_as_packed``: 3-row mRoPE position_ids classified as a packed row;
- ``positions_at_an_offset``: 0-based collator positions for a model numbering from 2;
- ``hybrid_without_seq_idx``: a Mamba2 hybrid (Bamba) packed with position_ids only;
- ``packed_rows_dropped_at_world_size``: packed rows that do not divide by the ranks;
- ``dpo_padding_free_fallback``: TRL's DPOTrainer turning ``padding_free=True`` into padding.

Shapes: packed rows (1, N); per-token log-probs (N,); position_ids (3, 1, T) for mRoPE.

Lessons: A6.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch

from packsim.core.errors import PacksimError
from packsim.core.segments import cu_seqlens_from_lengths
from packsim.exhibits.museum_rows import MuseumTable

__all__ = ["PUBLIC_BUGS", "PublicBug", "museum_beyond_sft_table", "public_bug_row"]

V = 96
LENGTHS = (7, 9, 6)  # the packed examples


@dataclass(frozen=True)
class PublicBug:
    """A public bug: ``run(buggy)`` returns (caught by ``probe``, the evidence in words)."""

    name: str
    title: str
    links: tuple[str, ...]
    story: str
    probe: str
    run: Callable[[bool], tuple[bool, str]]


def _row(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids (N,), cu_seqlens (S+1,)) of three examples packed into one row."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, V, (sum(LENGTHS),), generator=gen)
    cu = cu_seqlens_from_lengths(LENGTHS)  # (S+1,)
    return ids, cu


def _tiny_llama():
    from packsim.exhibits.trap_cases import build_family

    return build_family("llama", "sdpa")


# ----------------------------------------------------------------------------- verl#6475


def _label_roll(buggy: bool) -> tuple[bool, str]:
    """Per-sequence summed log-probs by the user's label code vs each sequence run alone."""
    model = _tiny_llama()
    ids, cu = _row()
    pos = torch.cat([torch.arange(n) for n in LENGTHS])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids[None], position_ids=pos[None], use_cache=False).logits[0].double(), -1)
        if buggy:  # verl's log_probs_from_logits_response_rmpad: one roll over the whole packed row
            labels, keep = torch.roll(ids, shifts=-1, dims=0), torch.ones_like(ids, dtype=torch.bool)
        else:  # shift inside each sequence: a sequence's last token predicts nothing
            labels, keep = torch.roll(ids, shifts=-1, dims=0), torch.ones_like(ids, dtype=torch.bool)
            keep[cu[1:] - 1] = False
        tok = logp.gather(-1, labels[:, None])[:, 0] * keep  # (N,)
        worst, where = 0.0, ""
        for s in range(len(LENGTHS)):
            a, b = int(cu[s]), int(cu[s + 1])
            alone = torch.log_softmax(model(input_ids=ids[None, a:b], use_cache=False).logits[0].double(), -1)  # (L, V)
            truth = float(alone[:-1].gather(-1, ids[a + 1:b, None]).sum())
            change = abs(float(tok[a:b].sum()) - truth)
            if change > worst:
                worst, where = change, f"sequence {s}"
    caught = worst > 1e-4  # fp32 logits summed over <= 9 tokens: round-off is ~1e-7
    return caught, (f"summed log-prob of {where} is off by {worst:.3f} from the sequence alone" if caught else
                    f"every sequence's summed log-prob matches it alone (max change {worst:.1e})")


# ----------------------------------------------------------------------------- transformers#47342


def _mrope_packed(buggy: bool) -> tuple[bool, str]:
    """transformers' flash-path classifier on unpacked and packed (3, 1, T) positions vs the truth."""
    from transformers.modeling_flash_attention_utils import _is_packed_sequence

    def classify(pos):
        if not buggy and pos.dim() == 3:  # the PR's normalisation: one axis (all share the layout)
            pos = pos[0]
        return bool(_is_packed_sequence(pos, batch_size=1))

    T = sum(LENGTHS)
    unpacked = torch.arange(T)[None, None].expand(3, 1, T)  # (3, 1, T): one text-only example
    packed = torch.cat([torch.arange(n) for n in LENGTHS])[None, None].expand(3, 1, T)  # (3, 1, T)
    got = {"unpacked": classify(unpacked), "packed": classify(packed)}
    wrong = [k for k, v in got.items() if v != (k == "packed")]
    return bool(wrong), (f"classified {', '.join(wrong)} (3, 1, {T}) position_ids wrongly: {got}" if wrong else
                         f"both (3, 1, {T}) layouts classified right: {got}")


# ----------------------------------------------------------------------------- transformers#47525


def _positions_offset(buggy: bool) -> tuple[bool, str]:
    """Each example alone, with the collator's position_ids vs the model's own numbering."""
    import transformers
    from transformers import DataCollatorWithFlattening

    torch.manual_seed(0)
    config = transformers.RobertaConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=64, max_position_embeddings=64, is_decoder=True,
                                        pad_token_id=1)
    model = transformers.RobertaForCausalLM(config).eval()
    collate = DataCollatorWithFlattening(position_ids_start=0 if buggy else config.pad_token_id + 1)
    ids, cu = _row(1)
    worst = 0.0
    with torch.no_grad():
        for s in range(len(LENGTHS)):
            batch = collate([{"input_ids": ids[int(cu[s]):int(cu[s + 1])].tolist()}])
            given = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
            own = model(input_ids=batch["input_ids"]).logits  # positions from padding_idx + 1
            worst = max(worst, float((given - own).abs().max()))
    caught = worst > 1e-5
    start = 0 if buggy else config.pad_token_id + 1
    return caught, f"position_ids_start={start}: logits move by up to {worst:.3g} vs the model's own positions"


# ----------------------------------------------------------------------------- hybrid without seq_idx


def _hybrid(buggy: bool) -> tuple[bool, str]:
    from packsim.auditing.auditor import audit
    from packsim.exhibits.hybrid_traps import build_frontier
    from packsim.reference.hybrid_emulation import emulate_hybrid_kernels, kernels_in_use

    model = build_frontier("bamba")
    ids, cu = _row(2)
    parts = [ids[int(cu[s]):int(cu[s + 1])] for s in range(len(LENGTHS))]
    batch = {"input_ids": ids[None], "position_ids": torch.cat([torch.arange(len(p)) for p in parts])[None]}
    if not buggy:  # the fix: the example index reaches the Mamba2 mixers' kernels
        batch["seq_idx"] = torch.cat([torch.full((len(p),), s) for s, p in enumerate(parts)])[None].to(torch.int32)
    with emulate_hybrid_kernels():  # a real causal_conv1d / mamba_ssm wins where installed
        kernel = kernels_in_use(model).get("mamba_chunk_scan_combined", "?")
        report = audit(model, batch, examples=[p.tolist() for p in parts], use_cache=False)
    finding = next((f for f in report.findings if f.name == "hybrid_state"), None)
    caught = not report.ok
    return caught, (f"audit failed: {', '.join(report.failed)}; {finding.evidence if finding else ''}"[:300]
                    if caught else f"audit passes: packed with seq_idx, scan kernel: {kernel}")


# ----------------------------------------------------------------------------- open-instruct#1271


def _world_size(buggy: bool) -> tuple[bool, str]:
    """Every packed row produced over the steps must be trained exactly once (none dropped, none twice)."""
    from packsim.core.packing import pack

    rng, world, produced, trained, leftover = random.Random(0), 4, Counter(), Counter(), []
    for step in range(3):
        lengths = [rng.randrange(20, 200) for _ in range(24)]
        rows = [f"step{step}/row{k}" for k, _ in enumerate(pack(lengths, 512))]
        produced.update(rows)
        rows = rows if buggy else leftover + rows
        usable = len(rows) // world * world  # B = len(packed) // world_size rows per rank
        trained.update(rows[:usable])
        leftover = [] if buggy else rows[usable:]  # the fix carries the rest to the next step
    pending = Counter(leftover)
    dropped = produced - trained - pending
    twice = [r for r, n in (trained + pending).items() if n > 1]
    caught = bool(dropped or twice)
    return caught, (f"{sum(dropped.values())} of {sum(produced.values())} packed rows never trained"
                    f"{f', {len(twice)} twice' if twice else ''} (world size {world})" if caught else
                    f"all {sum(produced.values())} packed rows trained once or carried over "
                    f"({sum(pending.values())} pending)")


# ----------------------------------------------------------------------------- trl#2469 / PR 6972


def _dpo_trainer(padding_free: bool):
    """A TRL ``DPOTrainer`` on packsim's tiny Llama and character tokenizer, two preference pairs (CPU)."""
    import copy
    import logging
    import tempfile

    import datasets
    import trl

    from packsim.core.model import build_model
    from packsim.core.tokenizer import build_tokenizer

    tok = copy.deepcopy(build_tokenizer())  # the cached one is shared: TRL may set fields on it
    model = build_model("tiny", vocab_size=len(tok), attn_implementation="sdpa")
    data = datasets.Dataset.from_dict({"prompt": ["hello there", "how are you"],
                                       "chosen": [" fine thanks", " good"], "rejected": [" no", " bad day"]})
    args = trl.DPOConfig(output_dir=tempfile.mkdtemp(prefix="packsim-dpo-"), padding_free=padding_free,
                         per_device_train_batch_size=2, max_steps=1, report_to="none", save_strategy="no",
                         use_cpu=True, bf16=False, seed=0)
    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    quiet = logging.getLogger("trl")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the fallback warning is what the piece measures, not what it prints
    try:  # ref_model given: TRL would otherwise reload the policy by its (empty) name_or_path
        return trl.DPOTrainer(model=model, ref_model=copy.deepcopy(model), args=args, train_dataset=data,
                              processing_class=tok)
    finally:
        quiet.setLevel(level)
        if bars:
            datasets.enable_progress_bars()


def _dpo_fallback(buggy: bool) -> tuple[bool, str]:
    """audit_trainer on a DPOTrainer asked for padding_free=True (buggy) or saying padding_free=False (fixed)."""
    from packsim.auditing.trainer import audit_trainer

    result = audit_trainer(_dpo_trainer(padding_free=buggy))
    finding = next(f for f in result.findings if f.name == "padding_free")
    caught = finding.status == "notice"  # a notice beside the PASS: padded rows corrupt nothing
    return caught, f"{finding.status}: {finding.evidence}; log-probs {result.logprobs.status}"


_HF = "https://github.com/huggingface/transformers"
PUBLIC_BUGS = {p.name: p for p in [
    PublicBug("label_roll_across_boundary", "torch.roll labels over a packed row",
          ("https://github.com/verl-project/verl/issues/6475",),
          "Reported (P0, found by static analysis) in verl's log_probs_from_logits_response_rmpad: the "
          "next-token labels of the padding-removed packed row came from one torch.roll over the row, so "
          "the last token of sequence i got the first token of sequence i+1 as its label (and the row's "
          "last token the first token of the row). Fix: shift inside each sequence (cu_seqlens).",
          "per-sequence summed log-probs vs each sequence alone", _label_roll),
    PublicBug("mrope_3d_taken_as_packed", "3-row mRoPE position_ids classified as packed",
          (f"{_HF}/pull/47342", f"{_HF}/pull/44911"),
          "transformers' _is_packed_sequence (the flash-attention path) assumed (batch, seq) position_ids; "
          "Qwen-VL-style MRoPE passes (3, batch, seq), which was misclassified as packed and sent unpacked "
          "batches down the varlen path (CUDA errors at train time, per the PR; #44911 shows cu_seqlens "
          "of 3x the tokens on Qwen3.5). Fix (PR 47342, open): classify on one axis. Measured here on the "
          "installed function; the crash itself needs flash-attn on a GPU.",
          "transformers' classifier vs the true layout", _mrope_packed),
    PublicBug("positions_at_an_offset", "0-based collator positions for a model that numbers from 2",
          (f"{_HF}/pull/47525",),
          "DataCollatorWithFlattening numbered positions from 0, but RoBERTa-like models compute their own "
          "from padding_idx + 1 (usually 2), so the collator's position_ids silently shifted the position "
          "embeddings. Fix (merged): DataCollatorWithFlattening(position_ids_start=2); the PR also reads "
          "flash boundaries at position_ids.min() instead of 0.",
          "each example with the collator's positions vs the model's own", _positions_offset),
    PublicBug("hybrid_without_seq_idx", "A Mamba2 hybrid packed with position_ids only",
          ("https://github.com/huggingface/transformers/pull/35861",),
          "Bamba gained padding-free training in transformers PR 35861 (its review discusses deriving "
          "cu_seq_lens from position_ids for the Mamba2 layers). In the installed transformers they must arrive as "
          "seq_idx (or cu_seqlens) at the causal_conv1d / mamba_ssm kernels; with position_ids only the "
          "conv and SSM state runs across every boundary, and on CPU the torch fallbacks ignore seq_idx "
          "(transformers then raises). Fix here: seq_idx, on the CUDA packages or, on any CPU, packsim's reference kernels.",
          "packsim.audit (perturbation) + the hybrid_state finding", _hybrid),
    PublicBug("packed_rows_dropped_at_world_size", "Packed rows dropped when they do not divide by the ranks",
          ("https://github.com/allenai/open-instruct/pull/1271", "https://github.com/allenai/open-instruct/issues/1295"),
          "grpo_fast.py packed a variable number of rows per step and, when that did not divide by the "
          "world size, silently truncated up to world_size - 1 of them (drop_last). The PR (closed "
          "unmerged) carried the excess rows to the next step, and a review comment warned that with "
          "world padding this could train rows twice. On issue 1295 (no rows per rank when there are fewer "
          "rows than ranks) a reply says PR 1308 fixed it by packing less. The fix planted here is the carry-over; the "
          "probe checks dropped and doubled rows.",
          "every packed row trained exactly once", _world_size),
    PublicBug("dpo_padding_free_fallback", "TRL DPO's padding_free=True silently trains padded rows",
          ("https://github.com/huggingface/trl/pull/6972", "https://github.com/huggingface/trl/pull/7014",
           "https://github.com/huggingface/trl/issues/2469"),
          "Since the DPO refactor, TRL's DPOTrainer.__init__ (trl/trainer/dpo_trainer.py, installed 1.16) "
          "answers padding_free=True with a logged warning ('Falling back to standard padding') and sets "
          "self.padding_free = False: a run configured to pack trains one padded sequence per row, with "
          "none of the memory saving the docs promised. PR 6972 (open) and PR 7014 (merged) document it; "
          "packed DPO itself is issue 2469 (open). The log-probs stay isolated (padding is safe), so only a "
          "check of what the trainer really does catches it. Fix here: say padding_free=False, so the "
          "config states what runs.",
          "audit_trainer's padding_free finding (trainer.padding_free vs args, the first batch's rows)",
          _dpo_fallback),
]}


def public_bug_row(bug: PublicBug) -> tuple[str, str, str, str, bool]:
    """The bug run buggy and fixed -> its museum-table row (name, title, link, caught by, fix passes)."""
    caught, _ = bug.run(True)
    fixed_caught, _ = bug.run(False)
    return bug.name, bug.title, bug.links[0], bug.probe if caught else "NOT CAUGHT", not fixed_caught


def museum_beyond_sft_table(names=None) -> MuseumTable:
    """Run every piece (or ``names``) buggy and fixed -> :class:`~packsim.exhibits.museum_rows.MuseumTable`."""
    chosen = list(PUBLIC_BUGS) if names is None else list(names)
    unknown = [n for n in chosen if n not in PUBLIC_BUGS]
    if unknown:
        raise PacksimError(f"unknown piece(s) {unknown}: use some of {list(PUBLIC_BUGS)}.")
    return MuseumTable([public_bug_row(PUBLIC_BUGS[name]) for name in chosen])
