"""The character-level tokenizer: exact roundtrips, fixed special ids, transformers compatibility."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from packsim.core.data import TASKS, make_examples
from packsim.core.errors import PacksimError
from packsim.core.tokenizer import (
    BOS_ID,
    CHARS,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    VOCAB_SIZE,
    build_tokenizer,
    decode,
    encode,
    encode_strict,
)


def test_special_ids_fixed_and_distinct():
    tok = build_tokenizer()
    assert (PAD_ID, BOS_ID, EOS_ID, UNK_ID) == (0, 1, 2, 3)
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert tok.convert_ids_to_tokens([0, 1, 2, 3]) == ["<pad>", "<bos>", "<eos>", "<unk>"]
    assert len(tok) == VOCAB_SIZE == 4 + len(CHARS) == 51


def test_cached_single_instance():
    assert build_tokenizer() is build_tokenizer()


def test_every_char_is_one_token():
    ids = encode(CHARS)
    assert ids == list(range(4, VOCAB_SIZE))
    assert decode(ids) == CHARS


@pytest.mark.parametrize("task", sorted(TASKS))
def test_roundtrip_every_task(task):
    for ex in make_examples(50, tasks=(task,), seed=3):
        for text, ids in ((ex.prompt_text, ex.prompt), (ex.response_text, ex.response)):
            assert encode(text) == ids == encode_strict(text)
            assert decode(ids) == text
        assert decode(ex.tokens) == f"<bos>{ex.prompt_text}{ex.response_text}<eos>"
        assert decode(ex.tokens, skip_special_tokens=True) == ex.text


def test_spaces_survive_roundtrip():
    text = "  a b  c "
    assert decode(encode(text)) == text
    assert build_tokenizer().decode(encode(text)) == text


def test_is_a_transformers_fast_tokenizer():
    tok = build_tokenizer()
    assert isinstance(tok, PreTrainedTokenizerFast)
    out = tok("abc")
    assert out["input_ids"] == [BOS_ID, *encode("abc"), EOS_ID]
    assert out["attention_mask"] == [1] * 5
    assert tok("abc", add_special_tokens=False)["input_ids"] == encode("abc")


def test_pad_and_batch_decode():
    tok = build_tokenizer()
    batch = tok.pad([tok("ab"), tok("abcd")], return_tensors="pt")
    assert batch["input_ids"].tolist() == [
        [1, *encode("ab"), 2, 0, 0],
        [1, *encode("abcd"), 2],
    ]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 0, 0], [1] * 6]
    assert tok.batch_decode(batch["input_ids"], skip_special_tokens=True) == ["ab", "abcd"]
    assert tok.decode(batch["input_ids"][0], skip_special_tokens=True) == "ab"


def test_decode_accepts_tensor():
    assert decode(torch.tensor([1, *encode("x=1"), 2]), skip_special_tokens=True) == "x=1"


def test_non_strict_encode_maps_unknown_to_unk():
    assert encode("aA") == [encode("a")[0], UNK_ID]


def test_strict_encode_names_the_unknown_char():
    with pytest.raises(PacksimError, match=r"'A' at position 4"):
        encode_strict("rev Abc=")
    with pytest.raises(PacksimError, match="'<'"):
        encode_strict("a<eos>")
    with pytest.raises(PacksimError, match="takes a str"):
        encode_strict(["a"])
