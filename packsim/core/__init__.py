"""The library core: from examples to a packed batch, its attention, its loss and the model.

Data flow: examples (``data``, ``tokenizer``) -> ``packing`` (which example goes in which row)
-> ``batch.PackedBatch`` (rows, labels, positions; ``setups`` picks mask x positions x loss)
-> ``segments`` / ``boundaries`` (where the examples are) -> ``masks`` / ``attention`` (the kernels;
``attention_backends`` says which can run and picks one) -> ``loss`` -> ``model``.
``attention_share`` measures the leak (attention on other examples); ``collator`` hands the same
rows to the transformers ``Trainer``; ``device`` and ``errors`` serve every layer.

This face names the public names a lesson or a user reaches for, each with its module; importing the
package loads none of them (PEP 562), so ``import packsim`` stays light.

Lessons: 05, 07, A4, A6.
"""

from packsim.core.lazy import lazy_names

# public name -> the module that defines it (imported on first access)
_HOMES = {
    "varlen_attention": "packsim.core.attention",
    "available_backends": "packsim.core.attention_backends",
    "resolve_backend": "packsim.core.attention_backends",
    "outside_share": "packsim.core.attention_share",
    "PackedBatch": "packsim.core.batch",
    "field_starts": "packsim.core.boundaries",
    "find_boundaries": "packsim.core.boundaries",
    "PackingCollator": "packsim.core.collator",
    "long_tailed_lengths": "packsim.core.data",
    "make_dataset": "packsim.core.data",
    "make_examples": "packsim.core.data",
    "make_long_tailed_examples": "packsim.core.data",
    "get_device": "packsim.core.device",
    "PacksimError": "packsim.core.errors",
    "IGNORE_INDEX": "packsim.core.loss",
    "Role": "packsim.core.loss",
    "count_targets": "packsim.core.loss",
    "packed_cross_entropy": "packsim.core.loss",
    "token_losses": "packsim.core.loss",
    "block_diagonal_mask": "packsim.core.masks",
    "block_sparsity": "packsim.core.masks",
    "causal_mask": "packsim.core.masks",
    "flex_block_mask": "packsim.core.masks",
    "to_additive_4d": "packsim.core.masks",
    "attention_maps": "packsim.core.model",
    "build_model": "packsim.core.model",
    "forward": "packsim.core.model",
    "examples_cut": "packsim.core.pack_stats",
    "packing_stats": "packsim.core.pack_stats",
    "as_piece": "packsim.core.packing",
    "pack": "packsim.core.packing",
    "pack_arrays": "packsim.core.packing",
    "repo_path": "packsim.core.paths",
    "cu_seqlens_from_lengths": "packsim.core.segments",
    "example_positions": "packsim.core.segments",
    "seq_ids_from_cu_seqlens": "packsim.core.segments",
    "SETUPS": "packsim.core.setups",
    "Setup": "packsim.core.setups",
    "get_setup": "packsim.core.setups",
    "attention_work": "packsim.core.tiles",
    "build_tokenizer": "packsim.core.tokenizer",
    "decode": "packsim.core.tokenizer",
    "encode": "packsim.core.tokenizer",
    "encode_strict": "packsim.core.tokenizer",
}

__all__ = sorted(_HOMES)


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())
