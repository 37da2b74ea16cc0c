"""What each cell of the live trap table runs: a tiny model of a family, an attention
implementation, and a packed row under one condition.

Models (:data:`FAMILIES`, :func:`build_family`): a tiny ``*ForCausalLM`` of each family (2 layers,
hidden 32, vocab 96, random weights, built from its config: no download). Implementations:
:data:`IMPLS`, the ``attn_implementation`` names transformers takes.

Conditions (:data:`CONDITIONS` says each in words; :func:`condition_batch` builds it) are batch
dicts passed as ``model(**batch, use_cache=...)``: a packed row of 32 tokens holding three
examples, input_ids (1, 32) or (2, 32) for ``rows``, position_ids (B, 32) restarting at each
example, optionally attention_mask (B, 32) of ones, (B, 32) with zeros on the row's last
:data:`PAD` tokens (padding next to the packed examples: ``zeros_mask``), or a 4D block-diagonal
mask (B, 1, 32, 32) (bool or additive float), or cu_seq_lens_q/k (S+1,) with max_length_q/k. The
example index ``seq`` (B, 32) that comes with each batch is -1 on padding. Each condition is a set
of options of :func:`packed_batch` (:data:`CONDITION_OPTIONS`), which builds any combination of
positions x mask x use_cache x rows (the trap explorer widget uses it). The measuring is in
:mod:`packsim.exhibits.traps`.

:data:`HUB_KERNEL` is the Hub flash kernel's ``attn_implementation`` name: the kernels package
downloads it from the Hugging Face Hub at load time (a CUDA build).

Lessons: none directly (lesson 04 calls :func:`packsim.exhibits.traps.trap_table`).
"""

from __future__ import annotations

import torch

from packsim.core.errors import PacksimError
from packsim.core.masks import block_diagonal_mask, to_additive_4d
from packsim.core.segments import cu_seqlens_from_lengths, example_positions

__all__ = ["CONDITIONS", "CONDITION_OPTIONS", "FAMILIES", "HUB_KERNEL", "IMPLS", "MASKS", "PAD", "POSITIONS",
           "TINY_DECODER", "TINY_IDS",
           "build_family", "condition_batch", "condition_of", "packed_batch"]

VOCAB = 96
ROWS = ((10, 13, 9), (12, 8, 12))  # example lengths of the two rows, 32 tokens each
PAD = 2  # mask="padded": the last PAD tokens of a row are padding (its last example PAD shorter)
HUB_KERNEL = "kernels-community/flash-attn2"
IMPLS = ("eager", "sdpa", "flex_attention", "flash_attention_2", HUB_KERNEL)
CONDITIONS = {
    "positions": "position_ids restart per example, no attention_mask, use_cache=False",
    "ones_mask": "the same plus an all-ones 2D attention_mask",
    "zeros_mask": (f"a 2D attention_mask with zeros next to the packed examples: the row's last {PAD} "
                   f"tokens are padding (its last example {PAD} tokens shorter), position_ids restart"),
    "cache": "the same as positions, but use_cache=True (a cache is built in the forward)",
    "rows": "two packed rows per batch (2, 32), position_ids restart, no mask, no cache",
    "cu_seq_lens": "cu_seq_lens_q/k and max_length_q/k given, position_ids 0..31 (no restart)",
    "bool_4d": "block-diagonal causal 4D mask (1, 1, 32, 32) as bool (True = attend)",
    "float_4d": "the same 4D mask as additive float (0 = attend, finfo.min elsewhere)",
}
# the tiny decoder every trap family is built from (the hybrid frontier's too), and its special ids
TINY_DECODER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=256)
TINY_IDS = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0)
# family -> (config class in transformers, config kwargs, what makes it different)
FAMILIES = {
    "llama": ("LlamaConfig", TINY_DECODER, "RoPE, grouped-query attention"),
    "qwen2": ("Qwen2Config", TINY_DECODER, "RoPE, q/k/v bias"),
    "qwen3": ("Qwen3Config", {**TINY_DECODER, "head_dim": 8}, "RoPE, q/k RMSNorm"),
    "mistral": ("MistralConfig", {**TINY_DECODER, "sliding_window": 8}, "RoPE, sliding window of 8"),
    "gemma": ("GemmaConfig", {**TINY_DECODER, "head_dim": 8}, "RoPE, scaled embeddings"),
    "gemma2": ("Gemma2Config", {**TINY_DECODER, "head_dim": 8, "sliding_window": 8},
               "logit softcapping, sliding window on every other layer"),
    "gpt2": ("GPT2Config", dict(n_positions=256, n_embd=32, n_layer=2, n_head=4),
             "absolute (learned) position embeddings"),
    "phi": ("PhiConfig", TINY_DECODER, "partial RoPE, parallel attention/MLP"),
}


def build_family(family: str, impl: str = "eager", seed: int = 0):
    """A tiny randomly initialised ``*ForCausalLM`` of ``family`` (fp32, eval mode)."""
    import transformers

    from packsim.core.model import model_from_config

    if family not in FAMILIES:
        raise PacksimError(f"unknown family {family!r}: use one of {sorted(FAMILIES)}.")
    cls_name, kwargs, _ = FAMILIES[family]
    config_cls = getattr(transformers, cls_name, None)
    if config_cls is None:
        raise PacksimError(f"transformers {transformers.__version__} has no {cls_name}: "
                           f"drop {family!r} from families=.")
    return model_from_config(config_cls(**kwargs, **TINY_IDS), attn_implementation=impl, seed=seed)


POSITIONS = ("restart", "continuous")  # position_ids 0..L-1 per example | 0..T-1 over the row
MASKS = ("none", "ones", "padded", "bool_4d", "float_4d")  # attention_mask options of :func:`packed_batch`
# condition -> the options of packed_batch it is (cu_seq_lens adds cu_seq_lens_q/k on top)
CONDITION_OPTIONS = {
    "positions": {},
    "ones_mask": {"mask": "ones"},
    "zeros_mask": {"mask": "padded"},
    "cache": {"use_cache": True},
    "rows": {"rows": 2},
    "cu_seq_lens": {"positions": "continuous"},
    "bool_4d": {"mask": "bool_4d"},
    "float_4d": {"mask": "float_4d"},
}


def _check_options(positions, mask, use_cache, rows) -> None:
    if positions not in POSITIONS:
        raise PacksimError(f"positions={positions!r}: use one of {list(POSITIONS)}.")
    if mask not in MASKS:
        raise PacksimError(f"mask={mask!r}: use one of {list(MASKS)}.")
    if not isinstance(use_cache, bool):
        raise PacksimError(f"use_cache={use_cache!r}: use True or False.")
    if isinstance(rows, bool) or rows not in (1, 2):
        raise PacksimError(f"rows={rows!r}: use 1 or 2 (packed rows per batch).")


def packed_batch(positions: str = "restart", mask: str = "none", use_cache: bool = False,
                 rows: int = 1, seed: int = 0) -> tuple[dict, dict, torch.Tensor]:
    """(batch dict, forward kwargs, example index (B, T)) of B = ``rows`` packed rows of 32 tokens.

    ``positions``: "restart" (0..L-1 per example) or "continuous" (0..31 over the row);
    ``mask``: "none", "ones" (B, T) long, "padded" (B, T) long with zeros on the last :data:`PAD`
    tokens of each row (padding: pad_token_id 0, example index -1, the last example PAD tokens
    shorter), "bool_4d" (B, 1, T, T) block-diagonal causal, True = attend, or "float_4d" (the
    same, additive: 0 = attend, finfo.min elsewhere);
    ``use_cache``: the forward's ``use_cache``. Every condition of the trap table is one of these
    (:data:`CONDITION_OPTIONS`), so the table and :func:`packsim.viz.trap_explorer` share it.
    """
    _check_options(positions, mask, use_cache, rows)
    lengths = ROWS[:rows]
    B, T = len(lengths), sum(lengths[0])
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (B, T), generator=gen)
    seq = torch.stack([torch.repeat_interleave(torch.arange(len(r)), torch.tensor(r)) for r in lengths])  # (B, T)
    if mask == "padded":
        seq[:, T - PAD:] = -1  # (B, T): the row's last PAD tokens are padding
        ids[:, T - PAD:] = TINY_IDS["pad_token_id"]
    if positions == "restart":
        pos = example_positions(seq)  # (B, T): 0..L-1 per example (the padding run counts 0..PAD-1)
    else:
        pos = torch.arange(T).expand(B, T).clone()  # (B, T)
    batch = {"input_ids": ids, "position_ids": pos}
    if mask == "ones":
        batch["attention_mask"] = torch.ones(B, T, dtype=torch.long)
    elif mask == "padded":
        batch["attention_mask"] = (seq >= 0).long()  # (B, T): zeros on the padding
    elif mask == "bool_4d":
        batch["attention_mask"] = block_diagonal_mask(seq)[:, None]  # (B, 1, T, T), True = attend
    elif mask == "float_4d":
        batch["attention_mask"] = to_additive_4d(block_diagonal_mask(seq))  # (B, 1, T, T)
    return batch, {"use_cache": use_cache}, seq


def condition_batch(condition: str, seed: int = 0) -> tuple[dict, dict, torch.Tensor]:
    """(batch dict, forward kwargs, example index (B, T)) for one condition."""
    if condition not in CONDITIONS:
        raise PacksimError(f"unknown condition {condition!r}: use one of {list(CONDITIONS)}.")
    batch, kwargs, seq = packed_batch(**CONDITION_OPTIONS[condition], seed=seed)
    if condition == "cu_seq_lens":
        cu = cu_seqlens_from_lengths(ROWS[0])  # (S+1,)
        batch.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(ROWS[0]),
                     max_length_k=max(ROWS[0]))
    return batch, kwargs, seq


def condition_of(positions: str = "restart", mask: str = "none", use_cache: bool = False,
                 rows: int = 1) -> str | None:
    """The trap-table condition that is exactly these options of :func:`packed_batch`, or None."""
    _check_options(positions, mask, use_cache, rows)
    given = {"positions": positions, "mask": mask, "use_cache": use_cache, "rows": rows}
    default = {"positions": "restart", "mask": "none", "use_cache": False, "rows": 1}
    for name, options in CONDITION_OPTIONS.items():
        if name != "cu_seq_lens" and {**default, **options} == given:
            return name
    return None
