"""Tests for packsim.reference.flash_emulation: transformers' own flash path on the reference kernel
(packsim, pure torch), not flash-attn, and the known flash traps reproduced and measured.

Ground truth is computed apart from the flash path: each example run alone through the same
weights with ``attn_implementation="eager"``. A spy on the reference kernels records what
transformers decided to call (which kernel, which ``cu_seqlens``, which ``window_size``), so
each trap is asserted on transformers' decision, not only on its symptom.

Families: the trap table's tiny models (:func:`packsim.exhibits.trap_cases.build_family`,
2 layers, hidden 32, GQA 4/2 heads), fp32; GPT-2 only in bf16 (see
``test_gpt2_in_fp32_stops_in_transformers_get_target_dtype``).
"""

from __future__ import annotations

import copy
import functools
import importlib.machinery
import importlib.util
import sys
import types

import pytest
import torch

import packsim
import packsim.reference.flash_emulation as flash_emulation
from packsim.core.model import build_model
from packsim.core.segments import cu_seqlens_from_lengths, example_positions
from packsim.core.upstream import flash_utils
from packsim.exhibits.trap_cases import build_family
from packsim.reference import flash as reference_flash
from packsim.reference.flash import REFERENCE_KERNEL
from packsim.reference.flash_emulation import (
    REAL_NAME,
    REFERENCE_NAME,
    FlashEmulation,
    emulate_flash,
    real_flash_attn,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TOL = 1e-5  # fp32: isolated
LEAK = 1e-2  # a later example moved by more than this: it saw an earlier one
FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "phi")
ROWS = ((10, 13, 9), (12, 8, 12))  # example lengths, 32 tokens a row
VOCAB = 96

# ---- batches and ground truth ---------------------------------------------------------------


def _row_batch(rows: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids (B, 32), position_ids (B, 32) restarting per example, example index (B, 32))."""
    lengths = ROWS[:rows]
    ids = torch.randint(3, VOCAB, (rows, 32), generator=torch.Generator().manual_seed(seed))
    seq = torch.stack([torch.repeat_interleave(torch.arange(len(r)), torch.tensor(r)) for r in lengths])
    return ids, example_positions(seq), seq


def _alone(eager, ids: torch.Tensor, position_ids=None) -> torch.Tensor:
    """Logits (L, V) of one sequence run by itself through eager, a plain causal mask (all-ones 2D)."""
    key = (eager, tuple(ids.tolist()), None if position_ids is None else tuple(position_ids.tolist()))
    if key not in _ALONE:  # the same examples recur across (a)-(c): run each once (the key holds the model)
        kwargs = {} if position_ids is None else {"position_ids": position_ids[None]}
        with torch.no_grad():
            _ALONE[key] = eager(input_ids=ids[None], attention_mask=torch.ones(1, ids.numel(), dtype=torch.long),
                                use_cache=False, **kwargs).logits[0].float()
    return _ALONE[key]


def _per_example(logits, eager, ids, seq) -> list[float]:
    """Max |packed - alone| per example, row 0's examples first. logits (B, T, V)."""
    diffs = []
    for b in range(seq.shape[0]):
        for e in dict.fromkeys(seq[b].tolist()):
            where = seq[b] == e
            diffs.append(float((logits[b, where] - _alone(eager, ids[b, where])).abs().max()))
    return diffs


_MODELS: dict = {}
_ALONE: dict = {}


def _models(family: str, dtype=torch.float32):
    """(model on the reference flash path, the same weights on eager), built once per family."""
    if (family, dtype) not in _MODELS:
        name = emulate_flash().name
        eager = build_family(family, "eager").to(dtype)
        flash = copy.deepcopy(eager)
        flash.set_attn_implementation(name)
        _MODELS[family, dtype] = flash, eager
    return _MODELS[family, dtype]


@pytest.fixture
def calls(monkeypatch):
    """Every call transformers makes into the reference kernels: [(kind, q shape, args, kwargs)]."""
    emulate_flash()
    record = []

    def spy(fn, kind):
        @functools.wraps(fn)  # inspect.signature follows __wrapped__: transformers sees fn's parameters
        def wrapped(q, k, v, *args, **kwargs):
            record.append((kind, tuple(q.shape), args, kwargs))
            return fn(q, k, v, *args, **kwargs)
        return wrapped

    monkeypatch.setattr(reference_flash, "flash_attn_func", spy(reference_flash.flash_attn_func, "dense"))
    monkeypatch.setattr(reference_flash, "flash_attn_varlen_func",
                        spy(reference_flash.flash_attn_varlen_func, "varlen"))
    with flash_utils.fresh_cache():  # the next forward imports the (spied) kernels; the cache restored after
        yield record


def _cu(call) -> list[int]:
    return call[3]["cu_seqlens_q"].tolist()


# ---- (a)-(d): packed vs each example alone, on transformers' flash path ----------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_a_one_row_with_restarting_positions_isolates(family, calls):
    flash, eager = _models(family)
    ids, pos, seq = _row_batch(1)
    with torch.no_grad():
        logits = flash(input_ids=ids, position_ids=pos, use_cache=False).logits.float()
    assert max(_per_example(logits, eager, ids, seq)) < TOL
    # transformers' decision: _is_packed_sequence (batch size 1) -> _prepare_from_posids -> varlen
    assert calls and {c[0] for c in calls} == {"varlen"} and _cu(calls[0]) == [0, 10, 23, 32]


@pytest.mark.parametrize("family", FAMILIES)
def test_b_two_rows_with_restarting_positions_and_no_cu_seq_lens_leak(family, calls):
    flash, eager = _models(family)
    ids, pos, seq = _row_batch(2)
    with torch.no_grad():
        logits = flash(input_ids=ids, position_ids=pos, use_cache=False).logits.float()
    first, *later = _per_example(logits[:1], eager, ids[:1], seq[:1])
    first_b, *later_b = _per_example(logits[1:], eager, ids[1:], seq[1:])
    assert max(first, first_b) < TOL and min(later + later_b) > LEAK
    # what runs instead: each row as ONE causal sequence (positions as given), as if unpacked.
    # modeling_flash_attention_utils._is_packed_sequence: `if position_ids is None or batch_size != 1
    # ...: return False`, so _flash_attention_forward falls through to flash_fn (no varlen).
    for b in range(2):
        assert float((logits[b] - _alone(eager, ids[b], pos[b])).abs().max()) < TOL
    assert {c[0] for c in calls} == {"dense"} and calls[0][1][:2] == (2, 32)


@pytest.mark.parametrize("family", FAMILIES)
def test_c_cu_seq_lens_fix_the_two_rows(family, calls):
    flash, eager = _models(family)
    ids, pos, seq = _row_batch(2)
    cu = cu_seqlens_from_lengths([n for row in ROWS for n in row])  # (7,) int32 over the 2 x 32 tokens
    with torch.no_grad():
        logits = flash(input_ids=ids, position_ids=pos, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=13,
                       max_length_k=13, use_cache=False).logits.float()
    assert max(_per_example(logits, eager, ids, seq)) < TOL
    assert {c[0] for c in calls} == {"varlen"} and _cu(calls[0]) == cu.tolist()


@pytest.mark.parametrize("family", FAMILIES)
def test_d_a_2d_mask_with_zeros_next_to_packed_positions_unpads_into_one_segment_per_row(family, calls):
    """Row: example 0 (10 tokens), 2 masked tokens, example 1 (13), example 2 (7); position_ids
    restart at every example (and at the masked run)."""
    flash, eager = _models(family)
    seq = torch.tensor([0] * 10 + [-1] * 2 + [1] * 13 + [2] * 7)[None]  # (1, 32), -1 = masked
    mask = (seq >= 0).long()  # (1, 32): zeros next to the packed positions
    ids, pos = _row_batch(1)[0], example_positions(seq)  # (1, 32), restarting
    with torch.no_grad():
        logits = flash(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=False).logits.float()
    kept = seq[0] >= 0
    first, *later = _per_example(logits[:, kept], eager, ids[:, kept], seq[:, kept])
    assert first < TOL and min(later) > LEAK
    # what transformers does: modeling_flash_attention_utils._flash_attention_forward, `if
    # attention_mask is not None:` -> _upad_input (before any look at position_ids): one segment per
    # ROW of the unmasked tokens, so the kept tokens run as one causal sequence.
    assert float((logits[0, kept] - _alone(eager, ids[0, kept], pos[0, kept])).abs().max()) < TOL
    assert {c[0] for c in calls} == {"varlen"} and _cu(calls[0]) == [0, 30]


def test_sliding_windows_and_softcap_are_transformers_decisions(calls):
    """gemma2: window on every other layer, softcap 50; transformers turns them into kernel keywords."""
    flash, eager = _models("gemma2")
    ids, pos, seq = _row_batch(1)
    with torch.no_grad():
        flash(input_ids=ids, position_ids=pos, use_cache=False)
    windows = [c[3].get("window_size") for c in calls]
    # sliding_window 8 -> window_size (7, 7) (_process_flash_attention_kwargs, key length 32 > 8)
    assert windows == [(7, 7), None] and {c[3]["softcap"] for c in calls} == {flash.config.attn_logit_softcapping}


def test_build_model_tiny_llama_on_the_flash_path():
    name = emulate_flash().name
    flash = build_model("tiny", vocab_size=VOCAB, attn_implementation=name)
    eager = copy.deepcopy(flash)
    eager.set_attn_implementation("eager")
    assert flash.config._attn_implementation == name
    ids, pos, seq = _row_batch(1)
    with torch.no_grad():
        one = flash(input_ids=ids, position_ids=pos).logits.float()
        ids2, pos2, seq2 = _row_batch(2)
        two = flash(input_ids=ids2, position_ids=pos2).logits.float()
    assert max(_per_example(one, eager, ids, seq)) < TOL
    assert max(_per_example(two, eager, ids2, seq2)) > LEAK


def test_gpt2_in_bf16_isolates_in_one_row_and_leaks_in_two():
    flash, eager = _models("gpt2", torch.bfloat16)
    ids, pos, seq = _row_batch(2)
    with torch.no_grad():
        one = flash(input_ids=ids[:1], position_ids=pos[:1], use_cache=False).logits.float()
        two = flash(input_ids=ids, position_ids=pos, use_cache=False).logits.float()
    assert max(_per_example(one, eager, ids[:1], seq[:1])) < LEAK  # bf16: isolated to ~2e-3
    diffs = _per_example(two, eager, ids, seq)
    assert min(diffs[1:3] + diffs[4:]) > 3 * LEAK


def test_gpt2_in_fp32_stops_in_transformers_get_target_dtype():
    """transformers' flash path itself, not the kernel: integrations/flash_attention.get_target_dtype
    looks for an nn.Linear to read the dtype of fp32 queries, and GPT-2 has Conv1D only. If this
    fails, transformers fixed it: run GPT-2 in fp32 with the other families."""
    name = emulate_flash().name
    model = build_family("gpt2", name)
    ids, pos, _ = _row_batch(1)
    with pytest.raises(StopIteration), torch.no_grad():
        model(input_ids=ids, position_ids=pos, use_cache=False)


# ---- emulate_flash: what it installs, idempotent, the real kernel wins ------------------------


def test_emulate_flash_says_what_it_did_and_is_idempotent(monkeypatch):
    emulate_flash()
    original = flash_utils.lazy_imports().__wrapped__
    monkeypatch.setattr(flash_utils.module(), "_lazy_imports", original)  # a fresh process: nothing installed
    for mapping in flash_utils.registries():
        monkeypatch.delitem(mapping, REFERENCE_NAME)
    first, second = emulate_flash(), emulate_flash()
    assert first == FlashEmulation(REFERENCE_NAME, REFERENCE_KERNEL, reference=True, installed=True)
    assert second == FlashEmulation(REFERENCE_NAME, REFERENCE_KERNEL, reference=True, installed=False)
    assert REFERENCE_KERNEL in str(first) and "installed now" in str(first) and "already" in str(second)
    assert flash_utils.lazy_imports().__wrapped__ is original  # one layer, however many calls
    assert REFERENCE_KERNEL in flash_utils.lazy_imports().__doc__


def test_only_the_kernels_are_ours():
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    emulate_flash()
    attention, _ = flash_utils.registries()
    assert attention[REFERENCE_NAME] is flash_utils.flash_functions()[0]
    assert ALL_MASK_ATTENTION_FUNCTIONS[REFERENCE_NAME] is ALL_MASK_ATTENTION_FUNCTIONS["flash_attention_2"]
    flash_fn, varlen_fn, kvcache_fn, pad_fn, unpad_fn = flash_utils.lazy_imports()(REFERENCE_NAME)
    assert (flash_fn, varlen_fn, kvcache_fn) == (reference_flash.flash_attn_func,
                                                 reference_flash.flash_attn_varlen_func, None)
    assert (pad_fn, unpad_fn) == flash_utils.pad_unpad()  # transformers' own padding


def test_no_flash_attn_package_is_faked():
    emulate_flash()
    assert "flash_attn" not in sys.modules and importlib.util.find_spec("flash_attn") is None


@pytest.fixture
def stand_in_flash_attn(monkeypatch):
    """A flash_attn module object in sys.modules (no __spec__), and CUDA said to be there."""
    module = types.ModuleType("flash_attn")
    module.__version__ = "2.99.0-standin"
    monkeypatch.setitem(sys.modules, "flash_attn", module)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    return module


def test_a_real_flash_attn_with_cuda_wins(stand_in_flash_attn):
    before = flash_utils.lazy_imports()
    got = emulate_flash()
    assert got == FlashEmulation(REAL_NAME, "flash-attn 2.99.0-standin", reference=False, installed=False)
    assert "flash-attn 2.99.0-standin" in str(got) and "nothing installed" in str(got)
    assert flash_utils.lazy_imports() is before  # nothing touched
    forced = emulate_flash(force_reference=True)
    assert forced.name == REFERENCE_NAME and forced.reference and forced.kernel == REFERENCE_KERNEL


def test_a_real_flash_attn_found_by_find_spec_wins(monkeypatch):
    spec = importlib.machinery.ModuleSpec("flash_attn", loader=None)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec if name == "flash_attn" else find_spec(name, *a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert real_flash_attn() == "flash-attn (version unknown)"
    assert emulate_flash().name == REAL_NAME
    assert "flash_attn" not in sys.modules  # found, never imported


def test_without_cuda_the_reference_runs_even_beside_flash_attn(stand_in_flash_attn, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert real_flash_attn() is None and emulate_flash().name == REFERENCE_NAME


def test_the_public_name_and_its_docstrings_say_reference_kernel():
    assert packsim.emulate_flash is emulate_flash
    for obj in (flash_emulation, FlashEmulation, emulate_flash):
        assert "reference kernel (packsim, pure torch), not flash-attn" in " ".join(obj.__doc__.split())


# ---- emulate_flash() as a context manager (issue 39) ------------------------------------------


@pytest.fixture
def nothing_installed(monkeypatch):
    """A fresh process's transformers: no wrapper, no registry entry; the installed state comes back after."""
    emulate_flash()
    original = flash_utils.lazy_imports().__wrapped__
    monkeypatch.setattr(flash_utils.module(), "_lazy_imports", original)
    for mapping in flash_utils.registries():
        monkeypatch.delitem(mapping, REFERENCE_NAME)
    return original


def _installed() -> tuple[bool, bool, bool]:
    """(the wrapper answers REFERENCE_NAME, AttentionInterface has it, AttentionMaskInterface has it)."""
    return (REFERENCE_NAME in flash_utils.wrapped_for(flash_utils.lazy_imports()),
            *(REFERENCE_NAME in mapping for mapping in flash_utils.registries()))


def test_with_emulate_flash_undoes_what_it_installed(nothing_installed):
    with emulate_flash() as flash:
        assert flash == FlashEmulation(REFERENCE_NAME, REFERENCE_KERNEL, reference=True, installed=True)
        assert _installed() == (True, True, True)
        model = build_model("tiny", vocab_size=VOCAB, attn_implementation=flash.name)  # it runs inside
        ids, pos, seq = _row_batch(1)
        eager = copy.deepcopy(model)
        eager.set_attn_implementation("eager")
        with torch.no_grad():
            assert max(_per_example(model(input_ids=ids, position_ids=pos).logits, eager, ids, seq)) < TOL
    assert _installed() == (False, False, False) and flash_utils.lazy_imports() is nothing_installed
    flash.__exit__(None, None, None)  # a second exit undoes nothing more
    assert flash_utils.lazy_imports() is nothing_installed
    with pytest.raises(RuntimeError, match="inside"), emulate_flash():  # an error inside undoes it too
        raise RuntimeError("inside")
    assert _installed() == (False, False, False)


def test_with_emulate_flash_leaves_what_was_installed_before(nothing_installed):
    plain = emulate_flash()  # installed by a plain call: stays
    wrapper = flash_utils.lazy_imports()
    with emulate_flash() as inner:
        assert not inner.installed
        with emulate_flash() as innermost:
            assert not innermost.installed
    assert plain.installed and _installed() == (True, True, True) and flash_utils.lazy_imports() is wrapper
    for mapping in flash_utils.registries():  # only the registry entries missing: only they are undone
        del mapping[REFERENCE_NAME]
    with emulate_flash() as partial:
        assert partial.installed and _installed() == (True, True, True)
    assert _installed() == (True, False, False) and flash_utils.lazy_imports() is wrapper


def test_with_emulate_flash_restores_an_entry_that_was_there(nothing_installed):
    attention, _ = flash_utils.registries()
    before = object()
    attention[REFERENCE_NAME] = before  # someone else's function under the name
    with emulate_flash():
        assert attention[REFERENCE_NAME] is flash_utils.flash_functions()[0]
    assert attention[REFERENCE_NAME] is before


def test_with_a_real_flash_attn_touches_nothing(stand_in_flash_attn):
    before = flash_utils.lazy_imports()
    with emulate_flash() as flash:
        assert flash.name == REAL_NAME and not flash.installed
    assert flash_utils.lazy_imports() is before


# ---- reference_for_flash_requests: a request for flash_attention_2 gets the reference ------------


def test_a_flash_attention_2_request_gets_the_reference_kernel_inside(nothing_installed):
    """Ground truth first: transformers refuses flash_attention_2 here (no flash-attn). Inside, the same
    request loads on the reference, runs isolated (each example alone on eager), and all is undone after."""
    from transformers import PreTrainedModel

    if real_flash_attn() is not None:
        pytest.skip("a real flash-attn runs flash_attention_2 here")
    original = PreTrainedModel.__dict__["_check_and_adjust_attn_implementation"]
    with pytest.raises((ImportError, ValueError), match="(?i)flash ?attention ?2"):
        build_family("llama", REAL_NAME)
    with flash_emulation.reference_for_flash_requests() as requests:
        assert requests.models == [] and requests.emulation is None and _installed() == (False, False, False)
        flash = build_family("llama", REAL_NAME)
        eager = build_family("llama", "eager")  # same seed: the same weights
        assert flash.config._attn_implementation == REFERENCE_NAME
        assert requests.models == ["LlamaForCausalLM"] and requests.emulation.installed
        ids, pos, seq = _row_batch(1)
        with torch.no_grad():
            logits = flash(input_ids=ids, position_ids=pos, use_cache=False).logits
        assert max(_per_example(logits, eager, ids, seq)) < TOL
        flash.set_attn_implementation(REAL_NAME)  # set_attn_implementation goes the same way
        assert flash.config._attn_implementation == REFERENCE_NAME and len(requests.models) == 2
    assert PreTrainedModel.__dict__["_check_and_adjust_attn_implementation"] is original
    assert _installed() == (False, False, False)
    with pytest.raises((ImportError, ValueError), match="(?i)flash ?attention ?2"):
        build_family("llama", REAL_NAME)


def test_a_model_without_flash_support_is_refused_as_on_a_gpu(nothing_installed):
    from transformers import LlamaConfig, LlamaForCausalLM

    class NoFlash(LlamaForCausalLM):
        _supports_flash_attn = False

    config = LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, attn_implementation=REAL_NAME)
    with flash_emulation.reference_for_flash_requests() as requests:
        with pytest.raises(ValueError, match="does not support Flash Attention"):
            NoFlash(config)
    assert requests.models == [] and requests.emulation is None


def test_with_a_real_flash_attn_requests_are_left_alone(stand_in_flash_attn):
    from transformers import PreTrainedModel

    original = PreTrainedModel.__dict__["_check_and_adjust_attn_implementation"]
    with flash_emulation.reference_for_flash_requests() as requests:
        assert PreTrainedModel.__dict__["_check_and_adjust_attn_implementation"] is original
    assert requests.models == [] and requests.emulation is None
