"""transformers' names for the cache and for checkpointing, which moved inside the tested window.

Per version (read from the installed 5.16.1 and 5.25.0 and the 5.17.0 / 5.18.0 wheels; 5.24.0, the
course's first stack, ran the tests written with the new names; 5.19 to 5.23 were not read):

- the cache a forward returns: the output field ``past_key_values`` up to 5.18
  (``modeling_outputs.CausalLMOutputWithPast``), ``cache`` from 5.24; there ``ModelOutput`` keeps
  ``past_key_values`` as a property that logs "`past_key_values`/`cache_params` are deprecated"
  (``utils/generic.py``, ``ModelOutput.past_key_values``). :func:`cache_of` reads the declared
  field, so it never logs;
- the forward's keyword for a cache: ``past_key_values`` up to 5.18 (``LlamaForCausalLM.forward``);
  ``cache`` from 5.24, where ``@deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")``
  still renames the old one (:func:`cache_kwargs`);
- activation checkpointing: ``gradient_checkpointing_enable`` up to 5.18 (``PreTrainedModel``,
  ``modeling_utils.py``); ``activation_checkpointing_enable`` from 5.24, where the old name is a
  deprecated alias that warns (``FutureWarning``) (:func:`enable_checkpointing`). With it on, a
  forward in train mode returns no cache (``modeling_layers.GradientCheckpointingLayer``): up to 5.18
  always, from 5.24 only with grad (:mod:`packsim.auditing.shared_pass` runs a checkpointed model's
  forward as the other probes see it).

:func:`per_version` says which side of the move an installed version was read as (None for the
releases not read), for the tests that pin these facts and the behaviour that moved with them.

All of these are public names; they live here because they moved, so a release that moves them
again fails tests/test_upstream_outputs.py first.

Lessons: none directly (lesson 04's forward-kwargs check and the trap tests use it).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import inspect
from collections.abc import Mapping

from packaging.version import Version

__all__ = ["CACHE_FIELDS", "NEWEST_OLD", "OLDEST_NEW", "cache_field", "cache_kwargs", "cache_of",
           "enable_checkpointing", "per_version"]

# the releases read on each side of the move: old names up to NEWEST_OLD, new ones from OLDEST_NEW
NEWEST_OLD, OLDEST_NEW = "5.18.0", "5.24.0"

# the output field that holds the cache: the 5.24-on name first, then the name up to 5.18
CACHE_FIELDS = ("cache", "past_key_values")


def per_version(new, old, version: str | None = None):
    """``new`` on a transformers (default: installed) from :data:`OLDEST_NEW`, ``old`` up to
    :data:`NEWEST_OLD`, None between (not read: either may hold there)."""
    v = Version(Version(version or importlib.metadata.version("transformers")).base_version)
    if v >= Version(OLDEST_NEW):
        return new
    return old if v <= Version(NEWEST_OLD) else None


def cache_field(output) -> str | None:
    """The field of ``output`` (a ``ModelOutput`` or its class, or a dict) that holds the cache, or
    None when it has none. A ``ModelOutput`` is read by its declared dataclass fields, which exist
    even when the value is None (its dict keys hold only the fields that are set)."""
    if dataclasses.is_dataclass(output):
        names = {f.name for f in dataclasses.fields(output)}
    elif isinstance(output, Mapping):
        names = set(output.keys())
    else:
        return None
    return next((name for name in CACHE_FIELDS if name in names), None)


def cache_of(output):
    """The cache a forward returned (None when it made none, or its output has no cache field)."""
    name = cache_field(output)
    if name is None:
        return None
    if dataclasses.is_dataclass(output):
        return getattr(output, name)
    return output.get(name)


def cache_kwargs(model) -> tuple[str, ...]:
    """The keywords the forward of ``model`` (or a model class) reads a cache from:
    ``("cache", "past_key_values")`` from transformers 5.24 (the old name renamed by
    ``deprecate_kwarg``), ``("past_key_values",)`` up to 5.18; read from the forward's signature."""
    cls = model if isinstance(model, type) else type(model)
    params = inspect.signature(cls.forward).parameters
    if "cache" in params:
        return ("cache", "past_key_values")
    return ("past_key_values",) if "past_key_values" in params else ()


def enable_checkpointing(model) -> None:
    """Turn on transformers' activation checkpointing (its defaults) under the installed name, with
    no deprecation warning: ``activation_checkpointing_enable`` from 5.24,
    ``gradient_checkpointing_enable`` before (their keyword arguments differ: none are passed)."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    (enable or model.gradient_checkpointing_enable)()
