"""Shared fixtures: seeded toy examples (from tests/toy.py) and a tiny model, small for a 2-core CPU."""

from __future__ import annotations

import os

import pytest
import torch
from toy import VOCAB, toy_examples

# Two cores: one thread per pytest-xdist worker (two workers fill them), else up to two.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else max(1, min(2, torch.get_num_threads())))


@pytest.fixture
def examples():
    """Five examples of varied length (9..21 tokens), fits 2+ per row at capacity 32."""
    return toy_examples([(4, 3), (10, 5), (2, 5), (6, 9), (3, 4)], seed=1)


@pytest.fixture(scope="module")
def tiny_model():
    from packsim.core.model import build_model

    return build_model("tiny", vocab_size=VOCAB, seed=0)
