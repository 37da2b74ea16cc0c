"""The audit leaves no trace: the model and the random generators come back as they were.

An audit runs the pipeline's forward many times (seeded, in train and eval mode, with hooks and
backward passes), so without care it would change the run it audits: the next training steps draw
other dropout masks (torch's generator advanced), a submodule left in eval comes back in train
(``model.train()`` on the root flattens every flag), a hook stays registered.
:func:`no_trace` saves, and restores on the way out (an exception too):

- the random generators: torch's CPU generator, every CUDA device's where CUDA is available,
  NumPy's global generator and Python's ``random``;
- each module's own ``training`` flag (per module, not ``model.train(was_training)`` on the root);
- the hooks: any forward / backward (pre-) hook registered inside, on a module or in
  ``torch.nn.modules.module``'s global hook dicts, is removed (those there before stay), and so is
  any attribute set on a module inside that it did not have: transformers installs its
  output-capturing hooks (router logits, attentions) once, on the first forward that asks, and
  marks the model ``_output_capturing_hooks_installed``; the mark goes with the hooks, so the next
  forward installs them again (without it a MoE's router logits would come back empty);
- each parameter's ``requires_grad`` and ``.grad`` (a backward inside adds nothing to them).

:func:`leaves_no_trace` applies it to an entry point (:func:`packsim.audit`,
:func:`packsim.audit_trainer`, :func:`packsim.audit_logprobs`): ``audit_trainer(trainer)`` then
``trainer.train()`` trains bit-identically to ``trainer.train()`` alone (``tests/test_no_trace.py``).

Lessons: none directly (every audit the course runs goes through it).
"""

from __future__ import annotations

import functools
import random
from contextlib import contextmanager

import torch
import torch.nn.modules.module as torch_module

__all__ = ["leaves_no_trace", "no_trace", "random_generators"]


def _hook_state(owner: dict) -> dict:
    """The hook attributes of a module's ``__dict__`` (or of torch's module namespace): dicts by
    their keys (a handle's id), flags such as ``_is_full_backward_hook`` by value."""
    return {name: (set(value) if isinstance(value, dict) else value)
            for name, value in owner.items()
            if "hook" in name and (isinstance(value, dict | bool) or value is None)}


def _restore_hooks(owner: dict, before: dict) -> None:
    for name, value in list(owner.items()):
        if name not in before:
            continue
        if isinstance(value, dict):
            for key in [k for k in value if k not in before[name]]:  # registered inside: remove
                del value[key]
        elif value is not before[name]:
            owner[name] = before[name]


@contextmanager
def random_generators():
    """Torch (CPU, every CUDA device: ``torch.random.fork_rng``), NumPy's global and Python's
    generators, as they were."""
    py = random.getstate()
    try:
        import numpy as np
        state = np.random.get_state()
    except ImportError:  # pragma: no cover - numpy ships with torch's usual installs
        np, state = None, None
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            random.setstate(py)
            if np is not None:
                np.random.set_state(state)


@contextmanager
def no_trace(model=None):
    """Run the body, then put back the random generators and, for a ``torch.nn.Module`` ``model``,
    each module's ``training`` flag and hooks and each parameter's ``requires_grad`` and ``.grad``."""
    modules = list(model.modules()) if isinstance(model, torch.nn.Module) else []
    params = [p for m in modules for p in m.parameters(recurse=False)]
    flags = [m.training for m in modules]
    hooks = [(_hook_state(vars(m)), set(vars(m))) for m in modules]
    global_hooks = _hook_state(vars(torch_module))
    grads = [(p.requires_grad, None if p.grad is None else p.grad.detach().clone()) for p in params]
    with random_generators():
        try:
            yield
        finally:
            _restore_hooks(vars(torch_module), global_hooks)
            for m, training, (before, attributes) in zip(modules, flags, hooks, strict=True):
                m.training = training
                _restore_hooks(vars(m), before)
                for name in set(vars(m)) - attributes:  # set inside (a lazy hooks-installed mark): gone
                    del vars(m)[name]
            with torch.no_grad():
                for p, (requires_grad, grad) in zip(params, grads, strict=True):
                    p.requires_grad_(requires_grad)
                    if grad is None or p.grad is None:
                        p.grad = grad
                    else:
                        p.grad.copy_(grad)


def _model_of(target):
    """The model an entry point's first argument holds: itself, or a trainer's ``.model``."""
    return target if isinstance(target, torch.nn.Module) else getattr(target, "model", target)


def leaves_no_trace(entry):
    """``entry(target, ...)`` run under :func:`no_trace` of ``target`` (a model, or a trainer's model)."""

    @functools.wraps(entry)
    def run(target, *args, **kwargs):
        with no_trace(_model_of(target)):
            return entry(target, *args, **kwargs)

    return run
