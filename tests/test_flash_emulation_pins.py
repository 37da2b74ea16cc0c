"""Pins: what packsim.core.flash_emulation relies on inside transformers (written against 5.24).

Each test names the function or attribute it pins and fails with a message saying what moved
and why it matters, so a transformers upgrade that changes the flash path stops here first,
not in a silently wrong trap table. Behaviour is pinned by running it where it is cheap; the
call structure (who calls whom with which name) by reading the installed source.
"""

from __future__ import annotations

import inspect
import re

import pytest
import torch
import transformers
import transformers.modeling_flash_attention_utils as fa
from transformers import AttentionInterface
from transformers.integrations import flash_attention as fa_integration
from transformers.integrations.hub_kernels import is_kernel
from transformers.masking_utils import (
    ALL_MASK_ATTENTION_FUNCTIONS,
    AttentionMaskInterface,
    flash_attention_mask,
)
from transformers.utils.generic import is_flash_attention_requested

from packsim.core import reference_flash
from packsim.core.flash_emulation import REFERENCE_NAME, emulate_flash

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def moved(what: str, why: str) -> str:
    return (f"transformers {transformers.__version__} moved {what}; packsim.core.flash_emulation relies on it "
            f"({why}). Read the new source, update flash_emulation and this pin, then rerun "
            "tests/test_flash_emulation.py.")


def params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def source(fn) -> str:
    return inspect.getsource(inspect.unwrap(fn))


def test_lazy_imports_is_the_one_place_kernels_are_picked():
    assert callable(getattr(fa, "_lazy_imports", None)), moved(
        "modeling_flash_attention_utils._lazy_imports", "it is wrapped to answer the reference name")
    assert params(inspect.unwrap(fa._lazy_imports))[:3] == ["implementation", "attention_wrapper", "allow_all_kernels"], \
        moved("the parameters of _lazy_imports", "the wrapper reads the first one as the implementation name")
    assert "_lazy_imports(" in source(fa.lazy_import_flash_attention), moved(
        "lazy_import_flash_attention's call of _lazy_imports", "that call is how the reference gets in")
    for cached in ("_loaded_implementation", "_flash_fn", "_flash_varlen_fn", "_pad_fn", "_unpad_fn",
                   "_process_flash_kwargs_fn"):
        assert hasattr(fa, cached), moved(f"the module global {cached}", "the single-slot kernel cache")
    assert callable(getattr(fa, "_pad_input", None)) and callable(getattr(fa, "_unpad_input", None)), moved(
        "_pad_input / _unpad_input", "the reference path pads and unpads with transformers' own")


def test_lazy_import_flash_attention_returns_the_reference_kernels(monkeypatch):
    emulate_flash()
    monkeypatch.setattr(fa, "_loaded_implementation", None)
    for cached in ("_flash_fn", "_flash_varlen_fn", "_flash_with_kvcache_fn", "_pad_fn", "_unpad_fn",
                   "_process_flash_kwargs_fn", "_process_with_kvcache_kwargs_fn"):
        monkeypatch.setattr(fa, cached, getattr(fa, cached))
    (flash_fn, varlen_fn, *_), (process, _) = fa.lazy_import_flash_attention(REFERENCE_NAME)
    assert (flash_fn, varlen_fn) == (reference_flash.flash_attn_func, reference_flash.flash_attn_varlen_func), \
        moved("what lazy_import_flash_attention returns", "the two kernels must be the reference's")
    got = process(query_length=32, key_length=32, is_causal=True, sliding_window=8, softcap=5.0,
                  max_seqlen_q=13, max_seqlen_k=13)
    assert got == {"causal": True, "softmax_scale": None, "dropout_p": 0.0, "window_size": (7, 7),
                   "deterministic": False, "softcap": 5.0, "max_seqlen_q": 13, "max_seqlen_k": 13}, moved(
        "_process_flash_attention_kwargs / _lazy_define_process_function (the keywords reaching the kernel)",
        "sliding windows and softcap are transformers' decisions, read off the reference's signature")


def test_flash_attention_forward_hands_the_config_name_to_the_kernel_picker():
    src = source(fa_integration.flash_attention_forward)
    assert "attn_implementation=module.config._attn_implementation" in src, moved(
        "integrations.flash_attention.flash_attention_forward's attn_implementation argument",
        "the registered name is what routes to the reference kernel")
    assert "lazy_import_flash_attention(attn_implementation)" in source(fa._flash_attention_forward), moved(
        "_flash_attention_forward's lazy_import_flash_attention call", "it picks the kernels per call")
    wanted = ["attention_mask", "query_length", "is_causal", "position_ids", "softmax_scale", "sliding_window",
              "softcap", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "attn_implementation"]
    missing = [p for p in wanted if p not in params(fa._flash_attention_forward)]
    assert not missing, moved(f"_flash_attention_forward's parameters {missing}", "the traps the tests measure")


def test_the_branch_order_of_flash_attention_forward():
    """2D mask first (_upad_input), then cu_seq_lens_*, then positions (_is_packed_sequence), then plain."""
    src = source(fa._flash_attention_forward)
    marks = ["if attention_mask is not None:", "_upad_input(", "if is_fa_with_varlen_kwargs:",
             "if _is_packed_sequence(position_ids, batch_size):", "_prepare_from_posids(", "out = flash_fn("]
    at = [src.find(m) for m in marks]
    assert -1 not in at and at == sorted(at), moved(
        f"the branches of _flash_attention_forward (found at {dict(zip(marks, at, strict=True))})",
        "trap (d) relies on the 2D mask winning over position_ids, trap (b) on the plain flash_fn fallback")


def test_is_packed_sequence_looks_at_batch_size_one_only():
    restart = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2]])
    assert bool(fa._is_packed_sequence(restart, 1)), moved(
        "_is_packed_sequence on one row of restarting positions", "trap (a): one row isolates")
    assert not fa._is_packed_sequence(restart.expand(2, -1), 2), moved(
        "_is_packed_sequence for batch size 2 (it now infers packing there: the two-row trap may be fixed "
        "upstream)", "trap (b): two rows with restarting positions and no cu_seq_lens leak")
    (cu, _), (max_q, _) = fa.prepare_fa_kwargs_from_position_ids(restart)
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 3, 5, 8] and int(max_q) == 3, moved(
        "prepare_fa_kwargs_from_position_ids", "segments from position restarts, int32 offsets")


def test_upad_input_unpads_by_the_mask_one_segment_per_row():
    assert params(fa._upad_input) == ["query_layer", "key_layer", "value_layer", "attention_mask", "query_length",
                                      "unpad_input_func"], moved("_upad_input's parameters", "trap (d)")
    q = torch.randn(1, 6, 2, 4)
    mask = torch.tensor([[1, 1, 0, 1, 1, 1]])
    *_, (cu_q, cu_k), _ = fa._upad_input(q, q, q, mask, 6, fa._unpad_input)
    assert cu_q.tolist() == cu_k.tolist() == [0, 5], moved(
        "_upad_input's segments (one per row of unmasked tokens)", "trap (d): zeros in a packed row's mask")


def test_a_name_with_flash_in_it_is_a_flash_implementation_and_not_a_hub_kernel():
    assert is_flash_attention_requested(requested_attention_implementation=REFERENCE_NAME), moved(
        "is_flash_attention_requested (no longer 'flash' in the name)",
        f"{REFERENCE_NAME!r} must count as flash everywhere transformers asks")
    assert not is_kernel(REFERENCE_NAME), moved(
        "integrations.hub_kernels.is_kernel", f"{REFERENCE_NAME!r} would be fetched from the hub")


def test_registries_and_the_flash_mask():
    for interface in (AttentionInterface, AttentionMaskInterface):
        assert callable(getattr(interface, "register", None)) and isinstance(interface._global_mapping, dict), \
            moved(f"{interface.__name__}.register / _global_mapping", "the reference name is registered there")
    assert ALL_MASK_ATTENTION_FUNCTIONS["flash_attention_2"] is flash_attention_mask, moved(
        "the mask function of 'flash_attention_2'", "the reference name reuses flash_attention_mask")
    from transformers import masking_utils

    assert "not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping" in source(masking_utils._preprocess_mask_arguments), \
        moved("_preprocess_mask_arguments' early exit for unregistered mask names",
              "without the mask registration the 2D padding mask would never reach the flash path")


def test_loading_a_registered_name_skips_flash_attns_own_checks():
    from transformers import LlamaConfig, LlamaForCausalLM

    name = emulate_flash().name
    src = source(transformers.PreTrainedModel.get_correct_attn_implementation)
    assert re.search(r"\^flash_attention_\(\\d\)\$", src), moved(
        "get_correct_attn_implementation's flash-attn check (only flash_attention_<n> names)",
        "a registered name must load in fp32 on CPU without flash-attn")
    assert getattr(LlamaForCausalLM, "_compatible_flash_implementations", None) is None, moved(
        "LlamaForCausalLM._compatible_flash_implementations", "a list would replace the reference name at load")
    config = LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, attn_implementation=name)
    model = LlamaForCausalLM(config)
    assert model.config._attn_implementation == name, moved(
        "the attention implementation a model keeps at load", f"it must stay {name!r}")


def test_causal_is_bottom_right_here():
    assert fa_integration._use_top_left_mask is False and fa.flash_attn_supports_top_left_mask() is False, moved(
        "flash_attn_supports_top_left_mask (now True here)",
        "the reference kernel aligns causal bottom-right like flash-attn 2 >= 2.1")
