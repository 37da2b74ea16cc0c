"""Tests for packsim.core.special_tokens: special ids from any source, and where the tokens start examples.

Each convention is a batch written out by hand with its true starts beside it; the rule
(``example_starts``) and the numbering (``seq_ids_from_starts``) must give exactly those.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from packsim.core.segments import seq_ids_from_starts
from packsim.core.special_tokens import example_starts, is_token, start_ids, token_ids


def _starts(T: int, *rows: set[int]) -> torch.Tensor:
    """(B, T) bool with True at the given positions of each row: the true starts, written by hand."""
    out = torch.zeros(len(rows), T, dtype=torch.bool)
    for r, at in enumerate(rows):
        out[r, sorted(at)] = True
    return out


def _real(T: int, *n_real: int) -> torch.Tensor:
    """(B, T) bool: the first n tokens of each row are real, the rest padding (right padding)."""
    return torch.arange(T)[None, :] < torch.tensor(n_real)[:, None]


# ----------------------------------------------------------------------------- reading the ids


def test_token_ids_from_a_tokenizer_a_processor_and_a_config():
    tok = SimpleNamespace(bos_token_id=1, eos_token_id=2)
    processor = SimpleNamespace(tokenizer=SimpleNamespace(bos_token_id=7, eos_token_id=None))
    config = SimpleNamespace(eos_token_id=[2, 9, None])  # a config may list several EOS
    assert token_ids("bos", tok, processor, config, None) == {1, 7}
    assert token_ids("eos", tok, processor, config, None) == {2, 9}
    assert token_ids("pad", tok, config) == set()


def test_start_ids_drop_a_bos_that_is_also_the_eos():
    assert start_ids({50256}, {50256}) == set()  # GPT-2: <|endoftext|> ends an example, starts none
    assert start_ids({1}, {2}) == {1}


def test_is_token_marks_the_ids_and_nothing_for_none():
    ids = torch.tensor([[5, 1, 2, 1]])
    assert is_token(ids, {1, 2}).tolist() == [[False, True, True, True]]
    assert is_token(ids, set()).tolist() == [[False] * 4]


# ----------------------------------------------------------------------------- the conventions


def test_bos_with_its_own_pad_gemma_llama2():
    BOS, EOS, PAD = 2, 1, 0  # Gemma's ids; Llama-2 is the same shape (bos 1, eos 2)
    ids = torch.tensor([[BOS, 10, 11, EOS, BOS, 12, EOS, BOS, 13, 14],
                        [BOS, 15, EOS, PAD, PAD, PAD, PAD, PAD, PAD, PAD]])
    real = _real(10, 10, 3)
    truth = _starts(10, {0, 4, 7}, {0})
    starts = example_starts(ids, real, {BOS}, {EOS})
    assert torch.equal(starts, truth)
    assert seq_ids_from_starts(starts, real).tolist() == [[0, 0, 0, 0, 1, 1, 1, 2, 2, 2],
                                                          [3, 3, 3, -1, -1, -1, -1, -1, -1, -1]]


def test_eos_is_pad_without_bos_gpt2():
    E = 50256  # GPT-2: bos == eos == pad, so there is no BOS and the EOS decides
    ids = torch.tensor([[10, 11, E, 12, 13, 14, E, 15, 16, E],
                        [17, E, E, 18, 19, E, E, E, E, E]])  # row 1: an EOS run (EOS + real pad) counts once
    real = _real(10, 10, 6)
    truth = _starts(10, {0, 3, 7}, {0, 3})
    starts = example_starts(ids, real, {E}, {E})
    assert torch.equal(starts, truth)
    assert seq_ids_from_starts(starts, real).tolist() == [[0, 0, 0, 1, 1, 1, 1, 2, 2, 2],
                                                          [3, 3, 3, 4, 4, 4, -1, -1, -1, -1]]


def test_bos_eos_and_a_llama3_pad_multi_turn():
    BOS, EOT, EOT_TEXT, PAD = 128000, 128009, 128001, 128004  # Llama-3: eos lists <|eot_id|>, pad of its own
    ids = torch.tensor([[BOS, 10, 11, EOT, 12, EOT, BOS, 13, EOT, 14],   # two turns, then the next example
                        [BOS, 15, EOT, 16, EOT, PAD, PAD, PAD, PAD, PAD]])
    real = _real(10, 10, 5)
    truth = _starts(10, {0, 6}, {0})  # an EOS that ends a turn starts nothing: the BOS marks every start
    assert torch.equal(example_starts(ids, real, {BOS}, {EOT, EOT_TEXT}), truth)
    split = example_starts(ids, real, {BOS}, {EOT, EOT_TEXT}, eos_starts=True)
    assert torch.equal(split, _starts(10, {0, 4, 6, 9}, {0, 3}))  # what the EOS rule would wrongly add


def test_multi_turn_without_bos_marks_every_turn_unless_told():
    E, PAD = 151645, 151643  # a chat template ending each turn with its EOS, no BOS
    ids = torch.tensor([[10, 11, E, 12, E, 13, E, 14, E, PAD]])  # one example of two exchanges
    real = _real(10, 9)
    assert torch.equal(example_starts(ids, real, set(), {E}), _starts(10, {0, 3, 5, 7}))  # pieces, not examples
    assert torch.equal(example_starts(ids, real, set(), {E}, eos_starts=False), _starts(10, {0}))


def test_wrapped_packing_eos_starts_even_with_a_bos_id():
    BOS, E = 1, 2  # the tokenizer has a BOS id but the examples do not begin with it; TRL ends each with EOS
    ids = torch.tensor([[10, 11, E, 12, 13, E, 14, 15, 16, 17]])  # the last example runs past the row
    real = _real(10, 10)
    assert torch.equal(example_starts(ids, real, {BOS}, {E}), _starts(10, {0}))  # default: the BOS decides
    starts = example_starts(ids, real, {BOS}, {E}, eos_starts=True)
    assert torch.equal(starts, _starts(10, {0, 3, 6}))
    assert seq_ids_from_starts(starts, real).tolist() == [[0, 0, 0, 1, 1, 1, 2, 2, 2, 2]]


def test_no_special_ids_say_nothing_and_padding_starts_nothing():
    ids = torch.tensor([[1, 5, 1, 5]])
    assert example_starts(ids, _real(4, 4), set(), set()) is None
    left = torch.tensor([[False, True, True, True]])  # left padding: the padding starts nothing
    starts = example_starts(ids, left, {1}, set())
    assert starts.tolist() == [[False, False, True, False]]
    assert seq_ids_from_starts(starts, left).tolist() == [[-1, 0, 1, 1]]  # the row's tokens still begin one
