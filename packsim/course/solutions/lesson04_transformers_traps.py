"""Reference solutions to the exercises of notebook 04_transformers_traps and its appendix A3 (checks: packsim.course.exercises.lesson04_transformers_traps)."""

from __future__ import annotations

import torch


def position_ids_from_lengths(lengths: list[int]) -> torch.Tensor:
    """Example lengths -> position ids (sum(lengths),) long that restart at 0 in every example."""
    return torch.cat([torch.arange(n) for n in lengths])


def forward_kwargs_for(rows: list[list[int]], attn_implementation: str) -> dict:
    """Rows of example lengths (each row the same total T) -> the fields of ``model(input_ids (B, T),
    **fields)`` that keep every example isolated on ``attn_implementation``.

    Everywhere: position_ids (B, T) restarting in every row, no attention_mask, use_cache=False
    (sdpa / eager / flex detect the pack from them only with no mask and no cache). flash_attention_2
    reads a pack from positions only in a one-row batch, so two rows also get the boundaries over
    the flattened batch: cu_seq_lens_q/k (S+1,) int32 and max_length_q/k.
    """
    fields = {"position_ids": torch.stack([position_ids_from_lengths(r) for r in rows]), "use_cache": False}
    if attn_implementation == "flash_attention_2" and len(rows) > 1:
        lengths = torch.tensor([n for r in rows for n in r])  # (S,): every example, row after row
        cu = torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0).to(torch.int32)])  # (S+1,)
        longest = int(lengths.max())
        fields.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest)
    return fields


# ---- appendix A3 ------------------------------------------------------------------------------


def seq_idx_from_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """position_ids (1, T) long, restarting at 0 per example -> seq_idx (1, T) int32: the example
    index of every token (0 for the first example, +1 wherever a position is 0), the dtype the
    Mamba2 kernels take and DataCollatorWithFlattening(return_seq_idx=True) gives."""
    return ((position_ids == 0).cumsum(-1) - 1).to(torch.int32)


def mrope_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """position_ids (1, T) long, restarting per example -> (4, 1, T) long for Qwen2-VL's text stack:
    row 0 the text positions (Qwen2VLTextModel.forward builds the packed mask from it), rows 1-3 the
    t, h, w rope rows, which for text tokens equal the text position (get_rope_index)."""
    return position_ids[None].expand(4, -1, -1).clone()
