"""The reference kernels (packsim, pure torch) and the emulation that puts them where transformers looks.

What a packed row needs from a fused kernel, computed in plain torch on any device so that CPU
checks are exact: flash-attn 2's two entry points (``flash``: ``flash_attn_func`` over (B, T, H, D),
``flash_attn_varlen_func`` over (total, H, D) with ``cu_seqlens`` (S+1,)), the ``causal_conv1d``
package's conv (``conv``: x (B, D, T) with ``seq_idx`` (B, T)), mamba_ssm's Mamba2 scan (``ssm``) and
flash-linear-attention's gated delta rule (``delta``), each restarting at every packed boundary.
Two calls wire them in and undo themselves on leaving a ``with`` block, a real package always
winning: ``flash_emulation`` (:func:`emulate_flash`: transformers' own flash-attention path on the
reference flash kernel) and ``hybrid_emulation`` (:func:`emulate_hybrid_kernels`: the hybrid
families' conv / scan / delta-rule kernels). Every reach into transformers' private machinery they
need is in :mod:`packsim.core.upstream`, with its pin test.

This room sits above ``core`` and below ``auditing`` (the audit measures a flash or hybrid model on a
CPU through it). This face names each public name's module; importing the package loads none of them
(PEP 562).

Lessons: none directly (A3 and the hybrid frontier table run models under it).
"""

from packsim.core.lazy import lazy_names

# public name -> the module that defines it (imported on first access)
_HOMES = {
    "causal_conv1d_fn": "packsim.reference.conv",
    "causal_conv1d_update": "packsim.reference.conv",
    "chunk_gated_delta_rule": "packsim.reference.delta",
    "fused_recurrent_gated_delta_rule": "packsim.reference.delta",
    "flash_attn_func": "packsim.reference.flash",
    "flash_attn_varlen_func": "packsim.reference.flash",
    "FlashEmulation": "packsim.reference.flash_emulation",
    "REFERENCE_NAME": "packsim.reference.flash_emulation",
    "emulate_flash": "packsim.reference.flash_emulation",
    "real_flash_attn": "packsim.reference.flash_emulation",
    "reference_for_flash_requests": "packsim.reference.flash_emulation",
    "HybridKernels": "packsim.reference.hybrid_emulation",
    "emulate_hybrid_kernels": "packsim.reference.hybrid_emulation",
    "kernels_in_use": "packsim.reference.hybrid_emulation",
    "mamba_chunk_scan_combined": "packsim.reference.ssm",
    "mamba_split_conv1d_scan_combined": "packsim.reference.ssm",
}

__all__ = sorted(_HOMES)


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())
