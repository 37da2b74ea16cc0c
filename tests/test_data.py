"""Synthetic data: correct answers, seeded determinism, held-out splits, validation, lengths."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest

from packsim.core.data import (
    DEFAULT_TASKS,
    TASKS,
    Example,
    examples_with_lengths,
    long_tailed_lengths,
    make_dataset,
    make_examples,
    make_long_tailed_examples,
    uniform_lengths,
)
from packsim.core.errors import PacksimError
from packsim.core.tokenizer import BOS_ID, EOS_ID, PAD_ID, encode

# ------------------------------------------------------------------ answers, recomputed from text


def solve(task: str, prompt: str) -> str:
    """Recompute the answer from the prompt text alone (independent of packsim.core.data)."""
    if task == "reverse":
        (s,) = re.fullmatch(r"rev ([a-z]{3,7})=", prompt).groups()
        return s[::-1]
    if task == "add":
        a, b = re.fullmatch(r"add (\d{1,2})\+(\d{1,2})=", prompt).groups()
        return str(int(a) + int(b))
    if task == "sort":
        (s,) = re.fullmatch(r"sort (\d{3,7})=", prompt).groups()
        return "".join(sorted(s))
    if task == "kv":
        pairs, query = re.fullmatch(r"((?:[a-z]:\d,){2,4}[a-z]:\d)\?([a-z])=", prompt).groups()
        table = dict(p.split(":") for p in pairs.split(","))
        assert 3 <= len(table) <= 5 and len(table) == pairs.count(":"), "keys must be distinct"
        return table[query]
    if task == "copy":
        (head,) = re.fullmatch(r"([a-z]+)\|[a-z]*>", prompt).groups()
        return head
    raise AssertionError(task)


@pytest.mark.parametrize("task", sorted(TASKS))
def test_task_answers_are_correct(task):
    examples = make_examples(300, tasks=task, seed=1)
    for ex in examples:
        assert ex.task == task
        assert ex.response_text == solve(task, ex.prompt_text)
        assert ex.prompt == encode(ex.prompt_text)
        assert ex.response == encode(ex.response_text)


def test_documented_examples():
    assert solve("reverse", "rev abcde=") == "edcba"
    assert solve("add", "add 12+34=") == "46"
    assert solve("sort", "sort 5132=") == "1235"
    assert solve("kv", "a:1,b:7,c:3?b=") == "7"


def test_tasks_cover_their_ranges():
    add = make_examples(2000, tasks="add", seed=0)
    sums = [int(e.response_text) for e in add]
    assert min(sums) >= 0 and max(sums) <= 198 and max(sums) > 150
    rev = make_examples(500, tasks="reverse", seed=0)
    assert {len(e.response_text) for e in rev} == set(range(3, 8))
    srt = make_examples(500, tasks="sort", seed=0)
    assert {len(e.response_text) for e in srt} == set(range(3, 8))
    kv = make_examples(500, tasks="kv", seed=0)
    assert {e.prompt_text.count(":") for e in kv} == {3, 4, 5}


def test_default_mix_interleaves_all_tasks():
    examples = make_examples(400, seed=0)
    counts = Counter(e.task for e in examples)
    assert set(counts) == set(DEFAULT_TASKS) == {"reverse", "add", "sort", "kv"}
    assert all(60 <= c <= 140 for c in counts.values()), counts
    # interleaved, not blocked by task
    assert sum(a.task != b.task for a, b in zip(examples, examples[1:], strict=False)) > 200


# ------------------------------------------------------------------ determinism


def test_same_seed_same_examples_different_seed_different():
    assert make_examples(100, seed=7) == make_examples(100, seed=7)
    assert make_examples(100, seed=7) != make_examples(100, seed=8)
    assert make_examples(50, seed=7) == make_examples(100, seed=7)[:50]


def test_make_dataset_deterministic_and_held_out():
    train, test = make_dataset(3000, 300, seed=0)
    assert len(train) == 3000 and len(test) == 300
    train_prompts = {e.prompt_text for e in train}
    test_prompts = [e.prompt_text for e in test]
    assert len(set(test_prompts)) == 300, "test prompts are distinct"
    assert train_prompts.isdisjoint(test_prompts)
    assert make_dataset(3000, 300, seed=0) == (train, test)
    train2, test2 = make_dataset(3000, 300, seed=1)
    assert train2 != train and test2 != test
    # the split is a property of the prompt, so it holds across seeds and sizes too
    assert {e.prompt_text for e in train2}.isdisjoint(test_prompts)
    assert train_prompts.isdisjoint(e.prompt_text for e in test2)
    assert set(Counter(e.task for e in test)) == set(DEFAULT_TASKS)


def test_make_dataset_small_space_errors():
    with pytest.raises(PacksimError, match="lower n_test"):
        make_dataset(10, 5000, tasks="add")  # only ~1000 'add' prompts are test prompts
    assert make_dataset(10, 0)[1] == []


# ------------------------------------------------------------------ Example


def test_example_layout():
    ex = Example.from_text("add 1+2=", "3", task="add")
    assert ex.tokens == [BOS_ID, *encode("add 1+2="), *encode("3"), EOS_ID]
    assert ex.n_prompt == 1 + 8
    assert ex.n_response == 2
    assert len(ex) == len(ex.tokens) == 11
    assert ex.text == "add 1+2=3"


def test_example_is_frozen_and_copies_its_lists():
    ids = [5, 6]
    ex = Example(ids, [7])
    ids.append(8)
    assert ex.prompt == [5, 6]
    with pytest.raises(AttributeError):
        ex.task = "x"


def test_example_accepts_numpy_ids():
    ex = Example(np.array([5, 6]), np.array([7]))
    assert ex.prompt == [5, 6] and all(type(t) is int for t in ex.prompt)
    assert ex == Example([5, 6], [7])


def test_example_validation():
    with pytest.raises(PacksimError, match="empty response: every example needs at least one"):
        Example([5], [])
    with pytest.raises(PacksimError, match="empty prompt"):
        Example([], [5])
    with pytest.raises(PacksimError, match="special token <eos>"):
        Example([5, EOS_ID], [6])
    with pytest.raises(PacksimError, match="special token <pad>"):
        Example([5], [6, PAD_ID])
    with pytest.raises(PacksimError, match="outside the vocabulary"):
        Example([5], [999])
    with pytest.raises(PacksimError, match="not a token id"):
        Example([5.0], [6])
    with pytest.raises(PacksimError, match="list of token ids"):
        Example("abc", [6])
    with pytest.raises(PacksimError, match="'A'"):
        Example.from_text("Abc", "d")


def test_bad_arguments():
    with pytest.raises(PacksimError, match="unknown task 'nope'.*'reverse'"):
        make_examples(3, tasks=("add", "nope"))
    with pytest.raises(PacksimError, match="tasks is empty"):
        make_examples(3, tasks=())
    for n in (0, -1):
        with pytest.raises(PacksimError, match="too small"):
            make_examples(n)
    with pytest.raises(PacksimError, match="must be an int"):
        make_examples(2.5)
    with pytest.raises(PacksimError, match="too small"):
        make_dataset(0, 10)


# ------------------------------------------------------------------ lengths


def test_long_tailed_lengths_distribution():
    lengths = long_tailed_lengths(20_000, median=90, sigma=0.9, max_len=2048, min_len=8, seed=0)
    assert lengths.dtype == np.int64 and lengths.shape == (20_000,)
    assert abs(np.median(lengths) - 90) <= 0.15 * 90
    assert lengths.min() >= 8 and lengths.max() <= 2048
    assert np.mean(lengths) > np.median(lengths) * 1.2, "long right tail"
    assert np.percentile(lengths, 99) > 4 * 90
    np.testing.assert_array_equal(lengths, long_tailed_lengths(20_000, seed=0))
    assert not np.array_equal(lengths, long_tailed_lengths(20_000, seed=1))


@pytest.mark.parametrize("median,max_len", [(40, 256), (300, 1024)])
def test_long_tailed_lengths_other_settings(median, max_len):
    lengths = long_tailed_lengths(5000, median=median, max_len=max_len, seed=3)
    assert abs(np.median(lengths) - median) <= 0.15 * median
    assert lengths.max() <= max_len and lengths.max() == max_len  # the tail hits the clip


def test_lengths_bad_arguments():
    with pytest.raises(PacksimError, match="median"):
        long_tailed_lengths(10, median=5000, max_len=2048)
    with pytest.raises(PacksimError, match="min_len"):
        long_tailed_lengths(10, min_len=100, max_len=50)
    with pytest.raises(PacksimError, match="sigma"):
        long_tailed_lengths(10, sigma=-1)
    with pytest.raises(PacksimError, match="low <= high"):
        uniform_lengths(10, 20, 10)


def test_uniform_lengths():
    lengths = uniform_lengths(5000, 10, 20, seed=0)
    assert lengths.dtype == np.int64
    assert set(lengths.tolist()) == set(range(10, 21))
    np.testing.assert_array_equal(lengths, uniform_lengths(5000, 10, 20, seed=0))


def test_long_tailed_examples_follow_the_lengths():
    examples = make_long_tailed_examples(500, seed=4)
    lengths = long_tailed_lengths(500, seed=4)
    assert [len(e) for e in examples] == lengths.tolist()
    for ex in examples:
        assert ex.task == "copy"
        assert ex.response_text == solve("copy", ex.prompt_text)
        assert 0.15 < ex.n_response / len(ex) < 0.5
    assert make_long_tailed_examples(50, seed=4) == examples[:50]


def test_examples_with_lengths_exact_including_shortest():
    lengths = [6, 7, 8, 9, 10, 50, 333]
    examples = examples_with_lengths(lengths, seed=0)
    assert [len(e) for e in examples] == lengths
    assert examples[0].prompt_text.endswith("|>") and len(examples[0].response) == 1
    with pytest.raises(PacksimError, match="below 6"):
        examples_with_lengths([5])
    with pytest.raises(PacksimError, match="response_frac"):
        examples_with_lengths([10], response_frac=0.6)
