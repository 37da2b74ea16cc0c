"""The course's exhibits above the audit: live tables that plant a bug, run the audit on it, and show
what caught it (appendices A3, A6, A8; lesson 04). A practitioner's audit never imports them.

=====================  ===========================================================================
module                 what it holds
=====================  ===========================================================================
``trap_cases``         what a trap-table cell runs: the tiny family models, the packed-row conditions
``trap_results``       :class:`TrapTable`: the measured cells as text, HTML or a heatmap
``traps``              :func:`trap_table`: is a packed row isolated, per family x attention x condition
``hybrid_sources``     why a hybrid family isolates or not, read from the installed transformers source
``hybrid_traps``       :func:`frontier_table`: the same rows for hybrid state-space and mRoPE models
``museum_rows``        :class:`MuseumTable`: one row per planted bug, what caught it, whether the fix passes
``museum_beyond_sft``  public bugs beyond SFT on attention-only decoders (RL, DPO, hybrids, mRoPE)
``cp_ring``            a context-parallel ring over a packed row in one process: by document, or causal
``museum_at_scale``    public bugs at scale (ring attention, varlen fields on sdpa, gated DeltaNet, ...)
``museum``             :func:`museum_table`: real-world packing bugs, planted and caught
``mask_cost``          what each backend's packed mask costs (lesson 04, A8)
``rope_scaling``       positions that keep counting under default, dynamic and longrope RoPE (A8)
``moe_coupling``       a dropless MoE packed: the forward isolated, the aux loss coupling (A8)
``bf16_roundoff``      packed vs alone in bf16: round-off, not a leak (A8)
=====================  ===========================================================================

Layer: above :mod:`packsim.auditing` (every exhibit runs the audit), below :mod:`packsim.experiment`.
Importing the package loads none of them: each public name loads its module on first use.

Lessons: A6, A8.
"""

from packsim.core.lazy import lazy_names

# public name -> the module that defines it (imported on first access, PEP 562)
_HOMES = {
    "EXHIBITS": "packsim.exhibits.museum",
    "museum_table": "packsim.exhibits.museum",
    "museum_beyond_sft_table": "packsim.exhibits.museum_beyond_sft",
    "museum_at_scale_table": "packsim.exhibits.museum_at_scale",
    "TrapTable": "packsim.exhibits.trap_results",
    "trap_table": "packsim.exhibits.traps",
    "frontier_table": "packsim.exhibits.hybrid_traps",
    "build_frontier": "packsim.exhibits.hybrid_traps",
    "frontier_batch": "packsim.exhibits.hybrid_traps",
    "frontier_cell": "packsim.exhibits.hybrid_traps",
    "frontier_needs": "packsim.exhibits.hybrid_traps",
    "AUDITED": "packsim.exhibits.museum",
    "PIECES_AT_SCALE": "packsim.exhibits.museum_at_scale",
    "step0_losses": "packsim.exhibits.cp_ring",
    "mask_costs": "packsim.exhibits.mask_cost",
    "unpacked_mask_cost": "packsim.exhibits.mask_cost",
    "ORIGINAL_CONTEXT": "packsim.exhibits.rope_scaling",
    "rope_table": "packsim.exhibits.rope_scaling",
    "moe_rows": "packsim.exhibits.moe_coupling",
    "moe_text": "packsim.exhibits.moe_coupling",
    "roundoff_rows": "packsim.exhibits.bf16_roundoff",
    "roundoff_text": "packsim.exhibits.bf16_roundoff",
}

__all__ = sorted(_HOMES)


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())
