"""Shared fixtures: seeded toy examples and a tiny model, small enough for a 2-core CPU."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))

VOCAB = 40
BOS, EOS = 1, 2


@dataclass(frozen=True)
class ToyExample:
    """Example-like: ``tokens`` = [BOS] + prompt + response + [EOS], ``n_prompt`` counts BOS."""

    tokens: tuple
    n_prompt: int


def toy_example(n_prompt_body: int, n_response_body: int, rng: random.Random) -> ToyExample:
    prompt = [rng.randrange(3, VOCAB) for _ in range(n_prompt_body)]
    response = [rng.randrange(3, VOCAB) for _ in range(n_response_body)]
    return ToyExample(tuple([BOS] + prompt + response + [EOS]), 1 + n_prompt_body)


def toy_examples(shapes, seed: int = 0) -> list[ToyExample]:
    rng = random.Random(seed)
    return [toy_example(p, r, rng) for p, r in shapes]


@pytest.fixture
def examples():
    """Five examples of varied length (9..21 tokens), fits 2+ per row at capacity 32."""
    return toy_examples([(4, 3), (10, 5), (2, 5), (6, 9), (3, 4)], seed=1)


@pytest.fixture(scope="module")
def tiny_model():
    from packsim.model import build_model

    return build_model("tiny", vocab_size=VOCAB, seed=0)
