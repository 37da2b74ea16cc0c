"""Trap-table rows for model kinds beyond attention-only decoders: hybrid state-space / linear-attention
models and a multimodal-RoPE (mRoPE) text stack, measured on the installed transformers.

Each family is a tiny ``*ForCausalLM`` (2 layers, hidden 32, vocab 96, random weights, built from its
config by :func:`packsim.core.model.model_from_config`: no download). Hybrid families: Bamba,
Qwen3-Next, LFM2, Mamba2, Zamba2, GraniteMoeHybrid, FalconH1. A cell runs one packed row of 32 tokens
(three examples of 10, 13 and 9 tokens) under one condition and compares each example's packed logits
with the example run alone (input_ids (1, L), no positions, no mask): the cell is "isolated" when no
token moves by more than ``tol`` (fp32: 1e-6 for hybrids, above their isolated cells' round-off and
below the smallest leak, the tiny gated DeltaNet's without ``cu_seq_lens_*``: docs/audit.md "Beyond
SFT on attention-only decoders" has the numbers; 1e-5 for mRoPE), "leaks"
otherwise, and "needs CUDA" when transformers refuses to run the condition because the only path
that keeps examples apart is a kernel package that is not bound. Then :func:`packsim.audit` runs the
same forward and the cell records whether its verdict agrees.

:func:`frontier_table` ("hybrid") and :func:`frontier_cell` (one hybrid cell) run inside
:func:`packsim.reference.hybrid_emulation.emulate_hybrid_kernels` (undone after: neither changes any
global state; ``reference_kernels=False`` keeps transformers as loaded): packsim's reference kernels (pure torch) stand where transformers looks for
``causal_conv1d``, ``mamba_ssm`` and ``flash-linear-attention``, unless the real package is there
(it wins). Every cell names the kernel its conv / scan / delta rule ran on (``Cell.kernel``), and
:func:`frontier_needs` says per family which fields it needs. What the installed transformers does
(read in its source, measured by the cells):

- the Mamba2 / short-convolution / gated-delta-rule layers call kernel functions wrapped by
  ``integrations.hub_kernels.use_kernel_func_from_hub_with_fallback``; without the packages (and
  without the reference kernels: ``reference_kernels=False``) the torch fallbacks take ``**kwargs``
  and ignore them, and the wrapper RAISES when ``seq_idx`` or ``cu_seqlens`` reaches a fallback on
  the transformers versions whose wrapper refuses (read from the installed wrapper by
  :func:`packsim.core.upstream.hub_kernels.refuses`); where it drops them silently, those cells leak;
- the conv kernels read ``seq_idx``, never ``cu_seq_lens_q/k`` (the wrapper passes a kernel only
  its own parameters); Qwen3-Next's gated delta rule takes ``cu_seq_lens_q`` as ``cu_seqlens``, so
  it needs both;
- ``GraniteMoeHybridModel`` builds its attention mask without ``position_ids`` (mask_kwargs in
  models/granitemoehybrid), so its attention needs a 4D block-diagonal mask next to ``seq_idx``;
- a call on the way from the model to its mixers may pass neither ``seq_idx`` nor ``**kwargs``
  (``Mamba2ForCausalLM.forward`` to its backbone, ``Mamba2Block`` and ``FalconH1DecoderLayer`` to
  their mixers, in models/mamba2 and models/falcon_h1): then ``seq_idx`` never reaches a mixer
  through it, with any kernel (the cells give file:line); where every call passes it, the family
  isolates with ``seq_idx`` like the others. :mod:`packsim.exhibits.hybrid_sources` reads which calls drop it from
  the installed source; which transformers versions do is in the README's "Tested versions" and
  docs/audit.md's "The versions the audit is tested on";
- the Qwen2-VL text model (models/qwen2_vl, ``Qwen2VLTextModel.forward``) builds the packed mask
  only from 4-row position_ids (text positions prepended to the 3 rope rows); 2D or 3-row
  positions are expanded and the mask is plain causal over the row.

:func:`frontier_table` returns a :class:`~packsim.exhibits.trap_results.TrapTable` (rows family x
impl, columns the family kind's conditions). Shapes: input_ids (1, 32), position_ids (1, 32) or
(3, 1, 32) / (4, 1, 32), seq_idx (1, 32) int32, cu_seq_lens_q/k (4,) int32, the block mask
(1, 1, 32, 32) float (0 inside an example's causal triangle, -inf elsewhere).

Lessons: A3, A6, A8.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from dataclasses import replace

import torch

from packsim.auditing.hybrid_findings import (
    CUDA_REFUSAL,
    boundary_kernels,
    kernel_words,
    needs_cuda_reason,
)
from packsim.core.errors import PacksimError
from packsim.core.segments import cu_seqlens_from_lengths, example_positions
from packsim.exhibits.hybrid_sources import family_why
from packsim.exhibits.trap_cases import ROWS, TINY_DECODER, TINY_IDS, VOCAB
from packsim.exhibits.trap_results import Cell, TrapTable

__all__ = ["CUDA_REFUSAL", "FRONTIER_CONDITIONS", "FRONTIER_FAMILIES", "FRONTIER_TOL", "build_frontier",
           "frontier_batch", "frontier_cell", "frontier_needs", "frontier_table", "needs_cuda_reason"]

_MAMBA = dict(mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=16, mamba_chunk_size=8,
              mamba_expand=2)
# family -> (kind, config class, config kwargs, what its stateful layer is)
FRONTIER_FAMILIES = {
    "bamba": ("hybrid", "BambaConfig", {**TINY_DECODER, **_MAMBA, "attn_layer_indices": [1]},
              "Mamba2 mixer (conv1d + SSM scan) then an attention layer"),
    "qwen3_next": ("hybrid", "Qwen3NextConfig",
                   {**TINY_DECODER, "layer_types": ["linear_attention", "full_attention"], "head_dim": 8,
                    "linear_num_value_heads": 2, "linear_num_key_heads": 2, "linear_key_head_dim": 8,
                    "linear_value_head_dim": 8, "num_experts": 2, "num_experts_per_tok": 1,
                    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32},
                   "gated DeltaNet (conv1d + gated delta rule) then an attention layer"),
    "lfm2": ("hybrid", "Lfm2Config", {**TINY_DECODER, "layer_types": ["conv", "full_attention"], "block_ff_dim": 64},
             "short convolution (kernel 3) then an attention layer"),
    "mamba2": ("hybrid", "Mamba2Config", dict(hidden_size=32, num_hidden_layers=2, num_heads=4, head_dim=16,
                                               n_groups=1, state_size=16, chunk_size=8, expand=2),
               "Mamba2 mixers only (no attention layer: the impl does not apply)"),
    "zamba2": ("hybrid", "Zamba2Config",
               dict(hidden_size=32, num_hidden_layers=2, layers_block_type=["mamba", "hybrid"], mamba_d_state=16,
                    mamba_expand=2, mamba_ngroups=1, n_mamba_heads=4, chunk_size=8, intermediate_size=64,
                    num_attention_heads=4, num_key_value_heads=4, num_mem_blocks=1, adapter_rank=8,
                    max_position_embeddings=256),
               "Mamba2 mixer, then a Mamba2 mixer with the shared attention block"),
    "granitemoehybrid": ("hybrid", "GraniteMoeHybridConfig",
                         {**TINY_DECODER, **_MAMBA, "layer_types": ["mamba", "attention"], "num_local_experts": 2,
                          "num_experts_per_tok": 1, "shared_intermediate_size": 32},
                         "Mamba2 layer then an attention layer (MoE MLPs)"),
    "falcon_h1": ("hybrid", "FalconH1Config",
                  {**TINY_DECODER, "mamba_d_ssm": 64, "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_n_groups": 1,
                   "mamba_d_state": 16, "mamba_chunk_size": 8, "mamba_expand": 2},
                  "Mamba2 mixer and attention side by side in every layer"),
    "qwen2_vl": ("mrope", "Qwen2VLConfig", {}, "multimodal RoPE: 3 rope rows (t, h, w), text stack only"),
}
_KIND_CONDITIONS = {
    "hybrid": ("positions", "seq_idx", "cu_seq_lens", "seq_idx_cu_seq_lens", "seq_idx_block_mask", "ones_mask"),
    "mrope": ("positions_2d", "positions_3d", "positions_4rows", "ones_mask_4rows"),
}
FRONTIER_CONDITIONS = {
    "positions": "position_ids (1, 32) restart per example, nothing else",
    "seq_idx": "position_ids plus seq_idx (1, 32) int32, the example index (DataCollatorWithFlattening(return_seq_idx=True))",
    "cu_seq_lens": "position_ids plus cu_seq_lens_q/k (4,) and max_length_q/k (return_flash_attn_kwargs=True), "
                   "no seq_idx",
    "seq_idx_cu_seq_lens": "position_ids, seq_idx and cu_seq_lens_q/k + max_length_q/k (what TRL's padding-free "
                           "collator gives)",
    "seq_idx_block_mask": "position_ids, seq_idx and a 4D attention_mask (1, 1, 32, 32): 0 causal inside each "
                          "example, -inf elsewhere",
    "ones_mask": "position_ids plus an all-ones 2D attention_mask",
    "positions_2d": "text position_ids (1, 32) restarting per example (as for a text-only model)",
    "positions_3d": "mRoPE position_ids (3, 1, 32): the restarting positions on all three rope rows",
    "positions_4rows": "position_ids (4, 1, 32): text positions prepended to the three rope rows",
    "ones_mask_4rows": "the 4-row position_ids plus an all-ones 2D attention_mask",
}
FRONTIER_TOL = {"hybrid": 1e-6, "mrope": 1e-5}  # fp32 isolation threshold per kind (see the module doc)
# the hybrid conditions that can isolate, fewest fields first, and the fields each one names
_NEEDS = {"seq_idx": "seq_idx", "seq_idx_cu_seq_lens": "seq_idx + cu_seq_lens_q/k",
          "seq_idx_block_mask": "seq_idx + a 4D block-diagonal attention_mask"}


def _vl_config(transformers):
    text = dict(**TINY_DECODER, **TINY_IDS,
                rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 10000.0})
    vision = dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2, in_channels=3, patch_size=2,
                  spatial_merge_size=1, temporal_patch_size=1)
    return transformers.Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=93,
                                      video_token_id=94, vision_start_token_id=95, bos_token_id=1,
                                      eos_token_id=2, pad_token_id=0)


def build_frontier(family: str, impl: str = "sdpa", seed: int = 0):
    """A tiny randomly initialised model of ``family`` (fp32, eval mode, ``attn_implementation=impl``),
    built by :func:`packsim.core.model.model_from_config`."""
    import transformers

    from packsim.core.model import model_from_config

    if family not in FRONTIER_FAMILIES:
        raise PacksimError(f"unknown family {family!r}: use one of {sorted(FRONTIER_FAMILIES)}.")
    _, cls_name, kwargs, _ = FRONTIER_FAMILIES[family]
    if getattr(transformers, cls_name, None) is None:
        raise PacksimError(f"transformers {transformers.__version__} has no {cls_name}: drop {family!r}.")
    if family == "qwen2_vl":  # the full VLM; its text stack runs when no pixels are given
        return model_from_config(_vl_config(transformers), impl, seed,
                                 auto_class=transformers.AutoModelForImageTextToText, quiet=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = getattr(transformers, cls_name)(**kwargs, **TINY_IDS)
    attn = None if family == "mamba2" else impl  # no attention layer
    return model_from_config(config, attn, seed, quiet=True)


def frontier_batch(condition: str, seed: int = 0) -> tuple[dict, torch.Tensor]:
    """(batch dict for ``model(**batch, use_cache=False)``, example index seq (1, 32)) of one condition."""
    if condition not in FRONTIER_CONDITIONS:
        raise PacksimError(f"unknown condition {condition!r}: use one of {list(FRONTIER_CONDITIONS)}.")
    lengths = ROWS[0]
    T = sum(lengths)
    ids = torch.randint(3, VOCAB - 3, (1, T), generator=torch.Generator().manual_seed(seed))  # (1, T)
    seq = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))[None]  # (1, T)
    pos = example_positions(seq)  # (1, T): 0..L-1 per example
    batch = {"input_ids": ids, "position_ids": pos}
    if condition.startswith("seq_idx"):
        batch["seq_idx"] = seq.to(torch.int32)  # (1, T)
    if condition.endswith("cu_seq_lens"):
        cu = cu_seqlens_from_lengths(lengths)  # (S+1,)
        batch.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(lengths), max_length_k=max(lengths))
    if condition == "seq_idx_block_mask":  # causal inside each example, -inf across
        keep = (seq[0][:, None] == seq[0][None, :]) & torch.ones(T, T, dtype=torch.bool).tril()  # (T, T)
        batch["attention_mask"] = torch.where(keep, 0.0, float("-inf"))[None, None]  # (1, 1, T, T)
    if condition == "positions_3d":
        batch["position_ids"] = pos[None].expand(3, 1, T).clone()  # (3, 1, T)
    elif condition in ("positions_4rows", "ones_mask_4rows"):
        batch["position_ids"] = pos[None].expand(4, 1, T).clone()  # (4, 1, T): text row first
    if condition in ("ones_mask", "ones_mask_4rows"):
        batch["attention_mask"] = torch.ones(1, T, dtype=torch.long)
    return batch, seq



class _Bound(torch.nn.Module):
    """``model`` with the batch's fields bound, so the audit runs the same forward with new tokens."""

    def __init__(self, model, fields: dict):
        super().__init__()
        self.inner, self.fields = model, fields
        self.config = model.config

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()

    def forward(self, input_ids=None, inputs_embeds=None, **kwargs):
        return self.inner(input_ids=input_ids, inputs_embeds=inputs_embeds, **self.fields, **kwargs)


def cell_kernel(model, family: str) -> str:
    """What the stateful layers' kernels of ``model`` run on now ('' for a model without any), and for
    Mamba2ForCausalLM why no packing field reaches them (:func:`~packsim.exhibits.hybrid_sources.family_why`)."""
    kernels = boundary_kernels(model)
    if not kernels:
        return ""
    words = f"conv / scan kernels on {kernel_words(kernels)}"
    why = family_why(family) if family == "mamba2" else ""
    return f"{words}; {why}" if why else words


def _kernels(kind: str, reference_kernels: bool):
    """What a measurement of ``kind`` runs under: for hybrids (``reference_kernels``)
    :func:`packsim.reference.hybrid_emulation.emulate_hybrid_kernels` (a real package wins; undone on
    exit), else nothing (transformers as this process has it)."""
    if kind == "hybrid" and reference_kernels:
        from packsim.reference.hybrid_emulation import emulate_hybrid_kernels

        try:
            return emulate_hybrid_kernels()
        except PacksimError as err:  # a transformers the wiring does not fit: say so, measure what is there
            warnings.warn(f"packsim: {err} These cells run on transformers as loaded (its torch fallbacks).",
                          UserWarning, stacklevel=3)
    return contextlib.nullcontext()


def frontier_cell(model, family: str, condition: str, *, tol: float | None = None, seed: int = 0,
                  impl: str = "sdpa", run_audit: bool = True, reference_kernels: bool = True) -> Cell:
    """Measure one cell of ``model`` (built by :func:`build_frontier`): packed vs each example alone,
    then audit the same forward (agreement in the Cell), as :func:`frontier_table` does.

    ``tol``: default :data:`FRONTIER_TOL` of the family's kind. ``reference_kernels`` (hybrid): run
    inside :func:`packsim.reference.hybrid_emulation.emulate_hybrid_kernels`, undone after (a real package
    wins); False: transformers as loaded (seq_idx "needs CUDA" without the packages). The Cell's
    ``kernel`` names what the conv / scan / delta rule ran on."""
    if family not in FRONTIER_FAMILIES:
        raise PacksimError(f"unknown family {family!r}: use one of {sorted(FRONTIER_FAMILIES)}.")
    kind = FRONTIER_FAMILIES[family][0]
    tol = FRONTIER_TOL[kind] if tol is None else float(tol)
    with _kernels(kind, reference_kernels):
        return _measure(model, family, condition, tol, seed, impl, run_audit)


def _measure(model, family: str, condition: str, tol: float, seed: int, impl: str, run_audit: bool) -> Cell:
    """One cell on whatever kernels transformers has bound now (the callers wire them)."""
    from packsim.auditing.auditor import audit_pipeline
    from packsim.auditing.pipeline import dict_pipeline, logits_of
    from packsim.exhibits.traps import LEAK_PROBES, alone_change

    batch, seq = frontier_batch(condition, seed)
    model.eval()  # the audit of the previous cell may leave it in train mode (Bamba's fused path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            changes = alone_change(model, batch, {"use_cache": False}, seq)
    except ValueError as err:
        reason = needs_cuda_reason(err)
        if not reason:
            raise
        return Cell(family, impl, condition, "needs CUDA", note=reason)
    kernel = cell_kernel(model, family)
    change = max(changes)
    status = "isolated" if change <= tol else "leaks"
    per = ", ".join(f"{c:.2e}" for c in changes)
    if not run_audit:
        return Cell(family, impl, condition, status, change, note=f"per example {per}", kernel=kernel)
    fields = {k: v for k, v in batch.items() if k != "input_ids"}
    p = dict_pipeline(_Bound(model, fields), {"input_ids": batch["input_ids"]}, None,
                      {"use_cache": False}, seq=seq, source="the frontier case's example lengths")
    p = replace(p, run_alone=lambda x, pos, mask: logits_of(
        model(input_ids=x, position_ids=pos, attention_mask=mask, use_cache=False)).logits)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report, _ = audit_pipeline(p, tol=tol, seed=seed)
    leaked = set(report.failed) & set(LEAK_PROBES)
    return Cell(family, impl, condition, status, change, audit_isolated=not leaked,
                audit_failed=tuple(report.failed), note=f"per example {per}", kernel=kernel)


def frontier_table(kind: str = "hybrid", families=None, impls=("sdpa",), *, tol: float | None = None,
                   seed: int = 0, run_audit: bool = True, reference_kernels: bool = True) -> TrapTable:
    """Measure the rows of ``kind`` ("hybrid" or "mrope"): every family of that kind x ``impls`` x
    the kind's conditions. Returns a :class:`TrapTable` (prints as text / HTML / heatmap).

    ``tol``: default :data:`FRONTIER_TOL` of the kind. ``reference_kernels`` (hybrid): run inside
    :func:`packsim.reference.hybrid_emulation.emulate_hybrid_kernels`, undone after (a real package
    wins); False: transformers as this process has it (seq_idx cells "needs CUDA" without the packages).
    """
    from packsim.exhibits.traps import versions

    if kind not in _KIND_CONDITIONS:
        raise PacksimError(f"kind={kind!r}: use 'hybrid' or 'mrope'.")
    mine = [f for f, spec in FRONTIER_FAMILIES.items() if spec[0] == kind]
    families = tuple(mine if families is None else ([families] if isinstance(families, str) else families))
    wrong = [f for f in families if f not in mine]
    if wrong:
        raise PacksimError(f"families {wrong} are not of kind {kind!r}: use some of {mine}.")
    impls = (impls,) if isinstance(impls, str) else tuple(impls)
    tol = FRONTIER_TOL[kind] if tol is None else float(tol)
    conditions = _KIND_CONDITIONS[kind]
    start = time.perf_counter()
    cells = []
    with _kernels(kind, reference_kernels):  # wired once for the table (frontier_cell wires per cell)
        for family in families:
            for impl in impls:
                model = build_frontier(family, impl, seed)
                cells += [_measure(model, family, c, tol, seed, impl, run_audit) for c in conditions]
    return TrapTable(cells, families, impls, conditions, versions(False), time.perf_counter() - start,
                     descriptions={c: FRONTIER_CONDITIONS[c] for c in conditions})


def frontier_needs(table: TrapTable) -> dict[str, str]:
    """{family: the fields it needs to isolate, read from the hybrid table's cells}: the fewest-field
    condition that isolates under every impl ("seq_idx", "seq_idx + cu_seq_lens_q/k", "seq_idx + a 4D
    block-diagonal attention_mask"), with why (:func:`~packsim.exhibits.hybrid_sources.family_why`) where transformers' code decides it;
    or why nothing in the table isolates it."""
    out = {}
    for family in table.families:
        why = family_why(family)
        found = next((fields for cond, fields in _NEEDS.items() if cond in table.conditions
                      and all(table.cell(family, i, cond).status == "isolated" for i in table.impls)), None)
        if found is not None:
            out[family] = f"{found}: {why}" if why else found
            continue
        cells = [table.cell(family, i, c) for c in _NEEDS if c in table.conditions for i in table.impls]
        if any(c.status == "needs CUDA" for c in cells):
            out[family] = "not measured here: transformers refuses seq_idx on its torch fallback (run with the " \
                          "reference kernels, frontier_table(reference_kernels=True), or the real packages)"
        else:
            out[family] = f"nothing in this table isolates it{': ' + why if why else ''}"
    return out
