"""Shared pieces of the real-pipeline tests (trainer audit, pre-flight CLI, forensics).

A module, not conftest: tests/browser has its own conftest. Import the fixture by name
(``from pipelines import one_thread``) and pytest uses it in that test module.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from packsim.core.model import build_model
from packsim.core.tokenizer import build_tokenizer

# prompt/completion pairs in the tiny tokenizer's alphabet
PAIRS = [("abc=", "cba"), ("hello:", "olleh"), ("x+y=", "z"), ("sort 321:", "123"),
         ("rev abcd:", "dcba"), ("k=v;", "v"), ("add 2 3:", "5"), ("up ab:", "ba")]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny matrices: one thread beats two fighting for a busy 2-core machine (measured 20x)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def save_tiny_checkpoint(path: Path) -> Path:
    """A tiny Llama (sdpa) and the local tokenizer, saved as any ``from_pretrained`` directory."""
    build_model("tiny", attn_implementation="sdpa", seed=0).save_pretrained(path)
    build_tokenizer().save_pretrained(path)
    return path
