"""accelerate's context parallelism as the transformers ``Trainer`` runs it: what packsim reads of it.

Read in accelerate 1.13.0 and 1.16.0 and transformers 5.16.1 and 5.25.0 (the tested window's ends):

- a trainer trains context-parallel when ``trainer.accelerator.parallelism_config`` (public: the
  ``TrainingArguments(parallelism_config=ParallelismConfig(cp_size=N))`` it was given) has
  ``cp_enabled`` (``cp_size > 1``) and ``cp_backend == "torch"`` (the default set in
  ``ParallelismConfig.__post_init__``);
- ``Accelerator._prepare_cp`` (``accelerator.py``) then calls ``big_modeling._attach_context_parallel_hooks``
  on the model: every submodule whose name ends in ``self_attn`` gets a forward pre-hook (prepended,
  with kwargs) that replaces a given ``attention_mask`` by None and sets ``is_causal=True``, "because
  context parallelism does not support attention masks" (its docstring). Every training step runs
  inside ``accelerator.maybe_context_parallel`` (``torch.distributed.tensor.experimental.context_parallel``
  over the ``cp`` mesh), which shards input_ids, labels, shift_labels, position_ids (and a 2D mask)
  along the sequence (``Trainer._prepare_context_parallel_inputs``), and torch's ring computes
  ``is_causal`` attention over the whole row;
- ``Trainer._prepare_context_parallel_inputs`` refuses any attention implementation but sdpa and a
  2D ``attention_mask`` that is not causal; ``position_ids`` are kept (sharded), so a packed row's
  positions restart per document while its attention, with the mask dropped, is causal over all of
  them: every document attends to the documents before it;
- accelerate builds such an Accelerator only for the multi-device types (MULTI_GPU, MULTI_XPU, ...)
  under FSDP2 (``state.py``: the FSDP and ``cp_size`` branch skips MULTI_CPU, and
  ``ParallelismConfig._validate_accelerator`` raises "ParallelismConfig is only compatible ... but got
  DistributedType.MULTI_CPU"): a context-parallel Trainer cannot be built on a CPU;
- building the Trainer builds the ``ParallelismConfig``'s device mesh (``Accelerator.__init__`` ->
  ``ParallelismConfig.get_device_mesh`` -> ``torch.distributed.init_device_mesh``), which starts a
  process group from torchrun's environment (``torch/distributed/rendezvous.py`` raises "environment
  variable RANK expected" without it): one plain process cannot build one either.

:func:`context_parallel_size` reads the first fact; :func:`cp_attention_hooks` attaches accelerate's own
hooks for the length of a ``with`` block and removes exactly those on leaving, so the audit's forward
runs the attention a context-parallel step runs. :func:`build_refusal` tells which of the last two
facts stopped a trainer from being built (from the files its traceback passes through), so the gate
names the fix. tests/test_upstream_accelerate_cp.py pins the hook's effect and this module's
reading per installed version, the refusals on one process and on two gloo ranks included.

Lessons: none directly.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["build_refusal", "context_parallel_size", "cp_attention_hooks", "hooked_modules"]

# the files a refusal passes through (forward slashes; matched at the end of each frame's path)
_PARALLELISM = "accelerate/parallelism_config.py"
_RENDEZVOUS = "torch/distributed/rendezvous.py"


def context_parallel_size(trainer) -> int:
    """The trainer's torch context-parallel size (``cp_size``), or 1 where it does not train context-parallel."""
    config = getattr(getattr(trainer, "accelerator", None), "parallelism_config", None)
    if config is None or not getattr(config, "cp_enabled", False):
        return 1
    return int(config.cp_size) if getattr(config, "cp_backend", "torch") == "torch" else 1


def hooked_modules(model) -> list[str]:
    """The names of the submodules accelerate's context-parallel hook goes on (names ending in ``self_attn``)."""
    return [name for name, _ in model.named_modules() if name.endswith("self_attn")]


@contextmanager
def cp_attention_hooks(model) -> Iterator[list[str]]:
    """accelerate's ``_attach_context_parallel_hooks`` on ``model`` inside the block; removed after.

    Yields the hooked modules' names. Only the hooks this call added are removed (each module's
    ``_forward_pre_hooks`` keys before and after), so hooks the user had stay, in their order."""
    from accelerate.big_modeling import _attach_context_parallel_hooks

    before = {m: set(m._forward_pre_hooks) for m in model.modules()}
    _attach_context_parallel_hooks(model)
    try:
        yield hooked_modules(model)
    finally:
        for m, keys in before.items():
            for key in set(m._forward_pre_hooks) - keys:
                m._forward_pre_hooks.pop(key)
                m._forward_pre_hooks_with_kwargs.pop(key, None)
                getattr(m, "_forward_pre_hooks_always_called", {}).pop(key, None)


def build_refusal(err: BaseException) -> str | None:
    """Why building a Trainer raised, where accelerate's ``ParallelismConfig`` refused the place it runs
    in: ``"launcher"`` (its device mesh needs torchrun's environment: one plain process), ``"device"``
    (accelerate's validation raised in CPU processes, where it runs no ParallelismConfig), or None
    for any other error (accelerate's own message says it). Read from the files the traceback passes
    through and the processes' distributed type, not from the message."""
    files = [frame.f_code.co_filename.replace(os.sep, "/") for frame, _ in traceback.walk_tb(err.__traceback__)]
    if not any(f.endswith(_PARALLELISM) for f in files):
        return None
    if any(f.endswith(_RENDEZVOUS) for f in files):
        return "launcher"
    from accelerate import PartialState

    return "device" if PartialState().distributed_type.name == "MULTI_CPU" else None
