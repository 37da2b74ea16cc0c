"""packsim.core.upstream.flash_utils: transformers' flash path, read on the installed version.

Each test names the version its facts were read from (transformers 5.16.1 and 5.25.0; 5.24.0 where
packsim's earlier pins, written against 5.24, said so) and fails naming what moved, so a release
that changes the flash path stops here first, not in a silently wrong trap table. Behaviour is
measured where it is cheap (the kernel picker, the cache, the keyword builder, the packing checks);
the call structure (who calls whom with which name, the branch order) is read from the installed
source. Where the versions differ, the test reads the installed version and says what it expects
per version; a version between two read ones, where a fact was not read, is skipped for that fact.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import re

import pytest
import torch
from packaging.version import Version

from packsim.core.upstream import flash_utils
from packsim.core.upstream.flash_utils import CACHE, CACHE_FROM_5_24
from packsim.reference import flash as reference_flash
from packsim.reference.flash_emulation import REFERENCE_NAME, emulate_flash

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TRANSFORMERS = Version(importlib.metadata.version("transformers"))
fa = flash_utils.module()


def moved(what: str, why: str, read: str = "5.16.1 and 5.25.0") -> str:
    return (f"transformers {TRANSFORMERS} moved {what} (read from {read}); packsim relies on it ({why}). "
            "Read the new source, update packsim.core.upstream.flash_utils and this pin, then rerun "
            "tests/test_reference_flash_emulation.py.")


def per_version(read: dict[str, object]):
    """The expectation for the installed version from facts read per version: ``{"5.16.1": a, "5.25.0": b}``
    -> ``a`` up to 5.16.1, ``b`` from 5.25.0 on; between two read versions with different facts: skip."""
    versions = sorted(read, key=Version)
    if TRANSFORMERS <= Version(versions[0]):
        return read[versions[0]]
    for low, high in zip(versions, versions[1:], strict=False):
        if TRANSFORMERS >= Version(high):
            continue
        if read[low] != read[high]:
            pytest.skip(f"transformers {TRANSFORMERS}: not read (between {low} and {high}, which differ)")
        return read[low]
    return read[versions[-1]]


def params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def source(fn) -> str:
    return inspect.getsource(inspect.unwrap(fn))


@pytest.fixture
def fresh():
    """The flash cache emptied for the test and restored after it (the globals this version has)."""
    emulate_flash()
    with flash_utils.fresh_cache():
        yield


# ---- the kernel picker and its cache ---------------------------------------------------------------


def test_pin_lazy_imports_is_the_one_place_kernels_are_picked():
    """Read from 5.16.1 and 5.25.0: ``_lazy_imports(implementation, attention_wrapper=None,
    allow_all_kernels=False)``, called by name from ``lazy_import_flash_attention``."""
    assert callable(getattr(fa, "_lazy_imports", None)), moved(
        "modeling_flash_attention_utils._lazy_imports", "it is wrapped to answer the reference name")
    assert params(inspect.unwrap(fa._lazy_imports))[:3] == ["implementation", "attention_wrapper",
                                                              "allow_all_kernels"], \
        moved("the parameters of _lazy_imports", "the wrapper reads the first one as the implementation name")
    assert "_lazy_imports(" in source(fa.lazy_import_flash_attention), moved(
        "lazy_import_flash_attention's call of _lazy_imports", "that call, through the module global, is how "
        "the reference gets in")
    assert all(callable(f) for f in flash_utils.pad_unpad()), moved(
        "_pad_input / _unpad_input", "the reference path pads and unpads with transformers' own")


def test_pin_the_cache_globals_per_version():
    """5.16.1: the seven of CACHE; 5.24.0 and 5.25.0: also _process_with_kvcache_kwargs_fn."""
    missing = [name for name in CACHE if not hasattr(fa, name)]
    assert not missing, moved(f"the module globals {missing}", "lazy_import_flash_attention's single-slot cache")
    has_kvcache = all(hasattr(fa, name) for name in CACHE_FROM_5_24)
    expected = per_version({"5.16.1": False, "5.24.0": True})
    assert has_kvcache == expected, moved(
        f"_process_with_kvcache_kwargs_fn (there: {has_kvcache}, expected {expected})",
        "the cache the tests snapshot", read="5.16.1 (absent), 5.24.0 and 5.25.0 (there)")
    assert flash_utils.cache_globals() == CACHE + (CACHE_FROM_5_24 if expected else ())


def test_pin_what_lazy_import_flash_attention_returns_per_version(fresh):
    """5.16.1: (five kernels, _process_flash_kwargs_fn); 5.24.0 and 5.25.0: (five kernels, (varlen's
    builder, kv-cache's builder)); 5.25.0: the kv-cache builder is ``dict`` when there is no kv-cache kernel."""
    kernels, process = fa.lazy_import_flash_attention(REFERENCE_NAME)
    assert len(kernels) == 5, moved("the five kernels lazy_import_flash_attention returns", "the reference's answer")
    pair = isinstance(process, tuple)
    assert pair == per_version({"5.16.1": False, "5.24.0": True}), moved(
        f"the keyword builders lazy_import_flash_attention returns (a pair: {pair})", "flash_utils.lazy_import "
        "reads both forms", read="5.16.1 (one), 5.24.0 and 5.25.0 (a pair)")
    if TRANSFORMERS >= Version("5.25"):
        assert process[1] is dict, moved("the kv-cache keyword builder without a kv-cache kernel",
                                         "the reference has no kv-cache kernel", read="5.25.0")


def test_pin_lazy_import_flash_attention_returns_the_reference_kernels(fresh):
    """Read from 5.16.1 and 5.25.0 (``_process_flash_attention_kwargs``, ``_lazy_define_process_function``):
    the keywords reaching the kernel are read off its signature, the same on both."""
    (flash_fn, varlen_fn, kvcache_fn, *padding), process = flash_utils.lazy_import(REFERENCE_NAME)
    assert (flash_fn, varlen_fn, kvcache_fn) == (reference_flash.flash_attn_func,
                                                 reference_flash.flash_attn_varlen_func, None), \
        moved("what lazy_import_flash_attention returns", "the two kernels must be the reference's")
    assert tuple(padding) == flash_utils.pad_unpad()
    got = process(query_length=32, key_length=32, is_causal=True, sliding_window=8, softcap=5.0,
                  max_seqlen_q=13, max_seqlen_k=13)
    assert got == {"causal": True, "softmax_scale": None, "dropout_p": 0.0, "window_size": (7, 7),
                   "deterministic": False, "softcap": 5.0, "max_seqlen_q": 13, "max_seqlen_k": 13}, moved(
        "_process_flash_attention_kwargs / _lazy_define_process_function (the keywords reaching the kernel)",
        "sliding windows and softcap are transformers' decisions, read off the reference's signature")


def test_pin_when_the_cache_marks_an_implementation_loaded_per_version(fresh, monkeypatch):
    """Measured: 5.16.1 sets _loaded_implementation before _lazy_imports runs (a failed import stays
    "loaded"); 5.24.0 and 5.25.0 only after it succeeded ("so that a failed load is retried")."""

    def fails(*args, **kwargs):
        raise ImportError("packsim: no such kernel")

    monkeypatch.setattr(fa, "_lazy_imports", fails)
    with pytest.raises(ImportError):
        fa.lazy_import_flash_attention("packsim_no_such_flash")
    marked = fa._loaded_implementation == "packsim_no_such_flash"
    expected = per_version({"5.16.1": True, "5.24.0": False})
    assert marked == expected, moved(f"when _loaded_implementation is set (after a failed import: {marked})",
                                     "fresh_cache empties it", read="5.16.1 (before), 5.24.0, 5.25.0 (after)")


def test_pin_a_wrapper_answers_one_name_and_passes_the_rest_on():
    seen = []
    wrapped = flash_utils.answering(lambda *a, **kw: seen.append((a, kw)) or "theirs", REFERENCE_NAME,
                                    lambda: ("flash", "varlen"))
    assert wrapped("flash_attention_2", None, allow_all_kernels=True) == "theirs"
    assert seen == [(("flash_attention_2", None), {"allow_all_kernels": True})]
    assert wrapped(REFERENCE_NAME)[:3] == ("flash", "varlen", None) and not seen[1:]
    assert flash_utils.wrapped_for(wrapped) == {REFERENCE_NAME}


# ---- the forward: who calls whom, and the branches the traps take ----------------------------------


def test_pin_flash_attention_forward_hands_the_config_name_to_the_kernel_picker():
    """Read from 5.16.1 and 5.25.0 (``integrations.flash_attention.flash_attention_forward``,
    ``_flash_attention_forward``; 5.16.1 breaks the call over three lines)."""
    from transformers.integrations import flash_attention as fa_integration

    src = source(fa_integration.flash_attention_forward)
    assert "attn_implementation=module.config._attn_implementation" in src, moved(
        "integrations.flash_attention.flash_attention_forward's attn_implementation argument",
        "the registered name is what routes to the reference kernel")
    call = r"lazy_import_flash_attention\(\s*attn_implementation\s*\)"
    assert re.search(call, source(fa._flash_attention_forward)), moved(
        "_flash_attention_forward's lazy_import_flash_attention call", "it picks the kernels per call")
    wanted = ["attention_mask", "query_length", "is_causal", "position_ids", "softmax_scale", "sliding_window",
              "softcap", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "attn_implementation"]
    missing = [p for p in wanted if p not in params(fa._flash_attention_forward)]
    assert not missing, moved(f"_flash_attention_forward's parameters {missing}", "the traps the tests measure")


_BRANCHES_5_16 = ("is_fa_with_position_ids = _is_packed_sequence(position_ids, batch_size=",
                  "if attention_mask is not None:", "_upad_input(",
                  "elif is_fa_with_varlen_kwargs or is_fa_with_position_ids:", "_prepare_from_posids(",
                  "out = flash_fn(")
_BRANCHES_5_24 = ("if attention_mask is not None:", "_upad_input(", "if is_fa_with_varlen_kwargs:",
                  "if _is_packed_sequence(position_ids, batch_size):", "_prepare_from_posids(", "out = flash_fn(")


def test_pin_the_branch_order_of_flash_attention_forward_per_version():
    """2D mask first (_upad_input), then cu_seq_lens_* or positions (_is_packed_sequence), then plain
    flash_fn. 5.16.1: one if/elif/else, the position check computed first; 5.24.0 and 5.25.0: separate
    ifs; 5.25.0: a paged kv-cache branch before them all."""
    marks = per_version({"5.16.1": _BRANCHES_5_16, "5.24.0": _BRANCHES_5_24})
    if TRANSFORMERS >= Version("5.25"):
        marks = ("if is_fa_with_paged_kwargs:", *marks)
    src = source(fa._flash_attention_forward)
    at = [src.find(m) for m in marks]
    assert -1 not in at and at == sorted(at), moved(
        f"the branches of _flash_attention_forward (found at {dict(zip(marks, at, strict=True))})",
        "trap (d) relies on the 2D mask winning over position_ids, trap (b) on the plain flash_fn fallback",
        read="5.16.1, 5.24.0 and 5.25.0")


def test_pin_is_packed_sequence_looks_at_batch_size_one_only():
    """Measured; the same answers on 5.16.1 (``return batch_size == 1 and ...``) and 5.25.0 (an early
    return for batch_size != 1 or one position)."""
    restart = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2]])
    assert bool(fa._is_packed_sequence(restart, 1)), moved(
        "_is_packed_sequence on one row of restarting positions", "trap (a): one row isolates")
    assert not fa._is_packed_sequence(restart.expand(2, -1), 2), moved(
        "_is_packed_sequence for batch size 2 (it now infers packing there: the two-row trap may be fixed "
        "upstream)", "trap (b): two rows with restarting positions and no cu_seq_lens leak")
    assert not bool(fa._is_packed_sequence(torch.tensor([[7]]), 1)), moved(
        "_is_packed_sequence on one position (decode)", "one token is one sequence")
    (cu, _), (max_q, _) = fa.prepare_fa_kwargs_from_position_ids(restart)
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 3, 5, 8] and int(max_q) == 3, moved(
        "prepare_fa_kwargs_from_position_ids", "segments from position restarts, int32 offsets")


def test_pin_upad_input_unpads_by_the_mask_one_segment_per_row():
    """Read and measured on 5.16.1 and 5.25.0 (the same function)."""
    assert params(fa._upad_input) == ["query_layer", "key_layer", "value_layer", "attention_mask", "query_length",
                                      "unpad_input_func"], moved("_upad_input's parameters", "trap (d)")
    q = torch.randn(1, 6, 2, 4)
    mask = torch.tensor([[1, 1, 0, 1, 1, 1]])
    *_, (cu_q, cu_k), _ = fa._upad_input(q, q, q, mask, 6, flash_utils.pad_unpad()[1])
    assert cu_q.tolist() == cu_k.tolist() == [0, 5], moved(
        "_upad_input's segments (one per row of unmasked tokens)", "trap (d): zeros in a packed row's mask")


def test_pin_a_kernel_without_softcap_per_version():
    """Measured: 5.16.1 drops ``softcap`` silently for a kernel without that parameter; 5.25.0 raises.
    (The reference takes ``softcap``, so it runs on both.)"""

    def no_softcap(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False):
        return q

    process = fa._lazy_define_process_function(no_softcap)
    expected = per_version({"5.16.1": "drops", "5.25.0": "raises"})
    try:
        kwargs = process(query_length=4, key_length=4, is_causal=True, softcap=5.0)
        got = "passes" if "softcap" in kwargs else "drops"
    except ValueError:
        got = "raises"
    assert got == expected, moved(f"_process_flash_attention_kwargs for a kernel without softcap ({got})",
                                  "a kernel that cannot softcap must not run a softcapped model silently")


# ---- the name: flash everywhere, registered, loaded without flash-attn's checks --------------------


def test_pin_a_name_with_flash_in_it_is_a_flash_implementation_and_not_a_hub_kernel():
    """Read from 5.16.1 and 5.25.0 (``utils.generic.is_flash_attention_requested``, ``hub_kernels.is_kernel``)."""
    from transformers.integrations.hub_kernels import is_kernel
    from transformers.utils.generic import is_flash_attention_requested

    assert is_flash_attention_requested(requested_attention_implementation=REFERENCE_NAME), moved(
        "is_flash_attention_requested (no longer 'flash' in the name)",
        f"{REFERENCE_NAME!r} must count as flash everywhere transformers asks")
    assert not is_kernel(REFERENCE_NAME), moved(
        "integrations.hub_kernels.is_kernel", f"{REFERENCE_NAME!r} would be fetched from the hub")


def test_pin_registries_and_the_flash_mask():
    """Read from 5.16.1 and 5.25.0: GeneralInterface's class dict ``_global_mapping`` and classmethod
    ``register``; 'flash_attention_2' -> flash_attention_mask; _preprocess_mask_arguments' early exit."""
    from transformers import AttentionInterface, masking_utils
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    interfaces = (AttentionInterface, AttentionMaskInterface)
    for interface, mapping in zip(interfaces, flash_utils.registries(), strict=True):
        assert callable(getattr(interface, "register", None)) and isinstance(mapping, dict), \
            moved(f"{interface.__name__}.register / _global_mapping", "the reference name is registered there")
    forward, mask = flash_utils.flash_functions()
    assert ALL_MASK_ATTENTION_FUNCTIONS["flash_attention_2"] is mask, moved(
        "the mask function of 'flash_attention_2'", "the reference name reuses flash_attention_mask")
    assert flash_utils.registries()[0]["flash_attention_2"] is forward, moved(
        "the attention function of 'flash_attention_2'", "the reference name reuses flash_attention_forward")
    early_exit = "not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping"
    assert early_exit in source(masking_utils._preprocess_mask_arguments), moved(
        "_preprocess_mask_arguments' early exit for unregistered mask names",
        "without the mask registration the 2D padding mask would never reach the flash path")


def test_pin_paged_flash_names_per_version():
    """5.16.1 registers 'paged|flash_attention_2' (continuous batching through the flash kernels); 5.25.0
    only 'paged|eager'. Neither has a paged form of the reference name: continuous batching is not emulated."""
    attention, _ = flash_utils.registries()
    expected = per_version({"5.16.1": True, "5.25.0": False})
    assert ("paged|flash_attention_2" in attention) == expected, moved(
        "the paged flash names in AttentionInterface", "the emulation registers no paged name")
    assert f"paged|{REFERENCE_NAME}" not in attention


def test_pin_loading_a_registered_name_skips_flash_attns_own_checks():
    """Read from 5.16.1 and 5.25.0 (``get_correct_attn_implementation``, ``_check_and_adjust_attn_implementation``)."""
    import transformers
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


def test_pin_causal_is_bottom_right_here():
    """Read from 5.16.1 and 5.25.0 (``flash_attn_supports_top_left_mask``: False without flash-attn)."""
    from transformers.integrations import flash_attention as fa_integration

    assert fa_integration._use_top_left_mask is False and fa.flash_attn_supports_top_left_mask() is False, moved(
        "flash_attn_supports_top_left_mask (now True here)",
        "the reference kernel aligns causal bottom-right like flash-attn 2 >= 2.1")


def test_pin_every_load_asks_check_and_adjust_attn_implementation():
    """Read from transformers 5.16.1 and 5.25.0 (modeling_utils.py): PreTrainedModel defines
    ``_check_and_adjust_attn_implementation(self, attn_implementation, is_init_check=False, ...)`` and a
    model class says whether it may use flash attention by ``_supports_flash_attn`` (what
    flash_utils.answering_attn_requests wraps and reads)."""
    import inspect

    from transformers import LlamaForCausalLM, PreTrainedModel

    method = PreTrainedModel.__dict__.get("_check_and_adjust_attn_implementation")
    assert method is not None, moved("PreTrainedModel._check_and_adjust_attn_implementation", "every load asks it")
    params = list(inspect.signature(method).parameters)
    assert params[:3] == ["self", "attn_implementation", "is_init_check"], moved(
        f"its parameters ({params})", "the wrapper passes attn_implementation second")
    assert LlamaForCausalLM._supports_flash_attn is True, moved("_supports_flash_attn", "which models may be answered")
