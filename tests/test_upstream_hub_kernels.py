"""packsim.core.upstream.hub_kernels: transformers' kernel wrapper, read on the installed version.

Each test names the version its facts were read from and fails naming what moved: the wrapper's
closure (transformers 5.24.0, 5.25.0), the ``kernels`` function module that holds it from 5.25 on
(kernels 0.19.1), the device check 5.25 added, and the refusal text the audit matches.
"""

import importlib.metadata
import importlib.util

import pytest
import torch
from packaging.version import Version

from packsim.core.upstream.hub_kernels import CELLS, REFUSAL, restore, swap, wrapper_cells

TRANSFORMERS = Version(importlib.metadata.version("transformers"))
KERNELS = importlib.util.find_spec("kernels") is not None


def _torch_version(x, seq_idx=None):
    return x


def _wrapper():
    from transformers.integrations.hub_kernels import use_kernel_func_from_hub_with_fallback

    return use_kernel_func_from_hub_with_fallback("causal_conv1d_fn", "packsim_no_such_package")(_torch_version)


def test_pin_the_wrapper_closes_over_what_packsim_reads():
    """Read from transformers 5.24.0 and 5.25.0 (integrations/hub_kernels.py)."""
    wrapper = _wrapper()
    cells = wrapper_cells(wrapper)
    assert cells is not None, (f"transformers {TRANSFORMERS} moved: use_kernel_func_from_hub_with_fallback's "
                               f"wrapper no longer closes over {CELLS}")
    assert cells["implementation"].cell_contents is _torch_version
    assert not cells["is_new_implementation"].cell_contents
    assert cells["func_name"].cell_contents == "causal_conv1d_fn"
    assert cells["package"].cell_contents == "packsim_no_such_package"
    with pytest.raises(ValueError, match=REFUSAL):
        wrapper(torch.zeros(1), seq_idx=torch.zeros(1))


def test_pin_what_the_model_module_holds_per_stack():
    """transformers 5.25 with kernels 0.19.1: an nn.Module (kernels' _create_func_module) whose forward
    closes over ``func``; without kernels: the wrapper function itself."""
    wrapper = _wrapper()
    if KERNELS and TRANSFORMERS >= Version("5.25"):
        assert isinstance(wrapper, torch.nn.Module), f"kernels {importlib.metadata.version('kernels')} moved"
        assert "func" in type(wrapper).forward.__code__.co_freevars
    elif not KERNELS:
        assert callable(wrapper) and not isinstance(wrapper, torch.nn.Module)
    assert wrapper_cells(wrapper) is not None


@pytest.mark.skipif(TRANSFORMERS < Version("5.25"), reason="the device check came with transformers 5.25")
def test_pin_the_device_check_of_5_25():
    """5.25 closes over ``supported_devices`` (None for the torch function, CUDA-only for causal_conv1d)."""
    from transformers.integrations import hub_kernels

    cells = wrapper_cells(_wrapper())
    assert "supported_devices" in cells and cells["supported_devices"].cell_contents is None
    assert hub_kernels._PACKAGE_SUPPORTED_DEVICES["causal_conv1d"] == ("cuda",)


def test_swap_runs_the_kernel_on_cpu_with_seq_idx_and_restores():
    wrapper = _wrapper()
    cells = wrapper_cells(wrapper)
    seen = {}

    def kernel(x, seq_idx=None):
        seen["seq_idx"] = seq_idx
        return x + 1

    before = swap(cells, kernel, ("x", "seq_idx"))
    s = torch.zeros(3, dtype=torch.int32)
    assert torch.equal(wrapper(torch.zeros(3), seq_idx=s, cu_seqlens=None), torch.ones(3))  # CPU: runs
    assert seen["seq_idx"] is s  # cu_seqlens filtered by the kernel's parameters
    restore(cells, before)
    assert cells["implementation"].cell_contents is _torch_version
    with pytest.raises(ValueError, match=REFUSAL):
        wrapper(torch.zeros(1), seq_idx=torch.zeros(1))


def test_anything_else_is_not_a_wrapper():
    assert wrapper_cells(_torch_version) is None
    assert wrapper_cells(torch.nn.Linear(1, 1)) is None
    assert wrapper_cells(len) is None
    assert wrapper_cells(object) is None
