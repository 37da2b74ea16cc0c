"""Seeded toy examples shared by the tests (a module, not conftest: tests/browser has its own conftest)."""

from __future__ import annotations

import random
from dataclasses import dataclass

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
