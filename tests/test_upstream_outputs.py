"""packsim.core.upstream.outputs: transformers' names for the cache and for checkpointing.

Each name is read per version: from transformers 5.16.1 and 5.25.0 (installed), 5.17.0 and 5.18.0
(wheels: the old names) and 5.24.0 (the course's first stack: the new names); 5.19 to 5.23 were
not read, so there either name passes. Each helper is then measured on a tiny Llama: the cache it
returns is the one the forward made (or was handed), and checkpointing drops the cache in a
training forward.
"""

from __future__ import annotations

import importlib.metadata
import warnings

import pytest
import torch
from packaging.version import Version
from transformers import DynamicCache, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from packsim.core.model import build_model
from packsim.core.upstream.outputs import (
    CACHE_FIELDS,
    cache_field,
    cache_kwargs,
    cache_of,
    enable_checkpointing,
    per_version,
)
from packsim.core.upstream.window import TESTED

TRANSFORMERS = Version(importlib.metadata.version("transformers"))
MOVED = f"transformers {TRANSFORMERS} moved it: "
IDS = torch.arange(1, 9)[None]  # (1, 8)


def agrees(got, new, old) -> bool:
    want = per_version(new, old)
    return got == want if want is not None else got in (new, old)


def _model():
    return build_model(size="tiny", vocab_size=64)


@pytest.mark.parametrize("version, want", [("5.16.1", "old"), ("5.18.0", "old"), ("5.20.0", None),
                                           ("5.24.0", "new"), ("5.26.0.dev0", "new")])
def test_per_version_says_none_where_nothing_was_read(version, want):
    assert per_version("new", "old", version) == want


def test_both_ends_of_the_window_were_read():
    """The window's ends (the two CI stacks) are read releases: every fact here is pinned there."""
    if str(TRANSFORMERS) in TESTED["transformers"]:
        assert per_version("new", "old") is not None


def test_pin_the_cache_field_per_version():
    """modeling_outputs.CausalLMOutputWithPast and BaseModelOutputWithPast: past_key_values up to
    5.18, cache from 5.24."""
    for cls in (CausalLMOutputWithPast, BaseModelOutputWithPast):
        got = cache_field(cls)
        assert agrees(got, "cache", "past_key_values"), MOVED + f"{cls.__name__} holds {got}"


def test_cache_of_is_the_cache_the_forward_made():
    model = _model()
    with torch.no_grad():
        made = model(input_ids=IDS, use_cache=True)
        none = model(input_ids=IDS, use_cache=False)
    assert isinstance(cache_of(made), DynamicCache)
    assert cache_of(made).get_seq_length() == IDS.shape[1]
    assert cache_field(none) in CACHE_FIELDS and cache_of(none) is None  # declared, though unset
    assert cache_of({"past_key_values": "c"}) == "c" and cache_of({"logits": 1}) is None
    assert cache_field(object()) is None and cache_of(torch.zeros(1)) is None


def test_pin_the_cache_keywords_per_version_and_measure_which_is_read():
    """LlamaForCausalLM.forward: past_key_values up to 5.18; cache from 5.24 (past_key_values
    renamed to it by deprecate_kwarg). Measured: a cache handed under a name it reads comes back."""
    model = _model()
    names = cache_kwargs(model)
    assert agrees(names, ("cache", "past_key_values"), ("past_key_values",)), MOVED + str(names)
    for name in CACHE_FIELDS:
        given = DynamicCache(config=model.config)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # 5.24 on: past_key_values is deprecated
            out = model(input_ids=IDS, use_cache=True, **{name: given})
        assert (cache_of(out) is given) == (name in names), (name, names)


def test_pin_the_checkpointing_name_per_version_and_measure_it():
    """PreTrainedModel: gradient_checkpointing_enable up to 5.18; activation_checkpointing_enable
    from 5.24, the old name a deprecated alias. Measured: a training forward with grad: no cache."""
    has_new = hasattr(PreTrainedModel, "activation_checkpointing_enable")
    assert agrees(has_new, True, False), MOVED + f"activation_checkpointing_enable: {has_new}"
    model = _model()
    model.config.use_cache = True
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the installed name: no deprecation warning
        enable_checkpointing(model)
    model.train()
    assert cache_of(model(input_ids=IDS)) is None
    if has_new:
        with pytest.warns(FutureWarning, match="gradient_checkpointing_enable"):
            _model().gradient_checkpointing_enable()
