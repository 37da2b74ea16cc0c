"""packsim.core.upstream.hub_kernels: transformers' kernel wrapper, read on the installed version.

Each test names the version its facts were read from and fails naming what moved: the wrapper's
closure (transformers 5.16.1, 5.24.0, 5.25.0), the kernel's names (cells from 5.24, the decorator
line before), the ``kernels`` function module that holds it where ``kernels`` is installed
(kernels 0.16.2, 0.19.1), the device check 5.25 added, and the refusal (5.24 on; 5.16.1 drops the
packed fields silently), each measured here by calling a wrapper.
"""

import importlib.metadata
import importlib.util

import pytest
import torch
from packaging.version import Version

from packsim.core.upstream.hub_kernels import (
    CELLS,
    REFUSAL,
    kernel_names,
    refuses,
    restore,
    swap,
    torch_function,
    wrapper_cells,
)

TRANSFORMERS = Version(importlib.metadata.version("transformers"))
KERNELS = importlib.util.find_spec("kernels") is not None


def _torch_version(x, seq_idx=None):
    return x


def _refused(wrapper) -> bool:
    """Measured: does the wrapper raise when seq_idx reaches its torch function?"""
    try:
        wrapper(torch.zeros(1), seq_idx=torch.zeros(1))
    except ValueError as err:
        assert REFUSAL in str(err), err
        return True
    return False


def _wrapper():
    from transformers.integrations.hub_kernels import use_kernel_func_from_hub_with_fallback

    return use_kernel_func_from_hub_with_fallback("causal_conv1d_fn", "packsim_no_such_package")(_torch_version)


def test_pin_the_wrapper_closes_over_what_packsim_reads():
    """Read from transformers 5.16.1, 5.24.0 and 5.25.0 (integrations/hub_kernels.py)."""
    wrapper = _wrapper()
    cells = wrapper_cells(wrapper)
    assert cells is not None, (f"transformers {TRANSFORMERS} moved: use_kernel_func_from_hub_with_fallback's "
                               f"wrapper no longer closes over {CELLS}")
    assert cells["implementation"].cell_contents is _torch_version
    assert not cells["is_new_implementation"].cell_contents
    assert torch_function(wrapper) is _torch_version


def test_pin_the_kernel_names_per_version():
    """From 5.24 the names are cells; before, the decorator line above the torch function says them
    (here the decorator is applied by a call, so only the cells can: 5.16.1 gives None)."""
    cells = wrapper_cells(_wrapper())
    if TRANSFORMERS >= Version("5.24"):
        assert kernel_names(cells) == ("causal_conv1d_fn", "packsim_no_such_package")
    else:
        assert "func_name" not in cells and kernel_names(cells) is None


def test_pin_the_decorator_line_names_a_modeling_kernel_on_every_version():
    """Qwen3-Next's torch function is torch_chunk_gated_delta_rule; its kernel is chunk_gated_delta_rule (fla)."""
    from transformers.models.qwen3_next import modeling_qwen3_next as mq

    assert kernel_names(wrapper_cells(mq.torch_chunk_gated_delta_rule)) == ("chunk_gated_delta_rule", "fla")


def test_pin_the_refusal_per_version():
    """5.24 and 5.25 raise when seq_idx reaches the torch function; 5.16.1 drops it silently. refuses()
    reads it from the wrapper's code; the call here measures it."""
    wrapper = _wrapper()
    measured = _refused(wrapper)
    assert refuses(wrapper_cells(wrapper)) == measured
    assert measured == (TRANSFORMERS >= Version("5.24")), f"transformers {TRANSFORMERS}: refusal {measured}"


def test_pin_what_the_model_module_holds_per_stack():
    """With kernels (0.16.2 beside 5.16.1, 0.19.1 beside 5.25): an nn.Module (kernels' _create_func_module)
    whose forward closes over ``func``; without kernels: the wrapper function itself."""
    wrapper = _wrapper()
    if KERNELS:
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
    assert _refused(wrapper) == refuses(cells)  # transformers' own behaviour is back


def test_anything_else_is_not_a_wrapper():
    assert wrapper_cells(_torch_version) is None
    assert wrapper_cells(torch.nn.Linear(1, 1)) is None
    assert wrapper_cells(len) is None
    assert wrapper_cells(object) is None
