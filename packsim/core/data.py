"""Synthetic instruction data, generated locally and seeded: the examples packsim packs.

An :class:`Example` is a prompt and a response as character-level token ids; its training
sequence is ``[<bos>] + prompt + response + [<eos>]`` and ``tokens[n_prompt:]`` (response plus
``<eos>``) are what a completion-only loss trains. Tasks (:data:`TASKS`, answers exact):
``reverse`` (``rev abcde=`` -> ``edcba``), ``add`` (``add 12+34=`` -> ``46``), ``sort``
(``sort 5132=`` -> ``1235``), ``kv`` (``a:1,b:7,c:3?b=`` -> ``7``) and ``copy``
(``abc|xyzw>`` -> ``abc``). The first four are the default mix (:data:`DEFAULT_TASKS`); ``copy``
stretches to any length, so :func:`make_long_tailed_examples` uses it for examples whose lengths
follow :func:`long_tailed_lengths` exactly (throughput studies).

Lessons: 00, 01, 02, 03, 04, 05, 06, 07, 08, 09, A1, A2, A3, A4, A6, A7, A8.
"""

from __future__ import annotations

import math
import random
import string
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from packsim.core.errors import PacksimError
from packsim.core.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, encode_strict

__all__ = [
    "Example",
    "Task",
    "TASKS",
    "DEFAULT_TASKS",
    "make_examples",
    "make_dataset",
    "long_tailed_lengths",
    "uniform_lengths",
    "examples_with_lengths",
    "make_long_tailed_examples",
]

_SPECIAL_IDS = {PAD_ID: "<pad>", BOS_ID: "<bos>", EOS_ID: "<eos>"}


def _explain_bad_ids(part: str, ids) -> None:
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
            raise PacksimError(
                f"Example.{part}[{i}] is {t!r} ({type(t).__name__}), not a token id; "
                "pass a flat list of ints."
            )
        if not 0 <= t < VOCAB_SIZE:
            raise PacksimError(
                f"Example.{part}[{i}] = {t} is outside the vocabulary [0, {VOCAB_SIZE}); "
                "encode text with packsim.core.tokenizer.encode_strict."
            )
        if t in _SPECIAL_IDS:
            raise PacksimError(
                f"Example.{part}[{i}] is the special token {_SPECIAL_IDS[t]} (id {t}); "
                "prompt and response hold text tokens only: Example.tokens adds <bos> and <eos> "
                "itself, and padding is the collator's job. Remove it."
            )


@dataclass(frozen=True)
class Example:
    """One prompt/response pair as token ids (no special tokens inside; ``tokens`` adds them)."""

    prompt: list[int]
    response: list[int]
    task: str = "custom"
    prompt_text: str = ""
    response_text: str = ""

    def __post_init__(self):
        for part in ("prompt", "response"):
            ids = getattr(self, part)
            if hasattr(ids, "tolist"):  # numpy array or torch tensor
                ids = ids.tolist()
            if isinstance(ids, (str, bytes, int)) or not hasattr(ids, "__len__"):
                raise PacksimError(
                    f"Example.{part} must be a list of token ids, got {type(ids).__name__}; "
                    "encode text first (packsim.core.tokenizer.encode_strict) or use Example.from_text."
                )
            if len(ids) == 0:
                raise PacksimError(
                    f"example has an empty {part}: every example needs at least one {part} token; "
                    "drop it or fill it."
                )
            if not (
                all(type(t) is int for t in ids)
                and min(ids) >= 0
                and max(ids) < VOCAB_SIZE
                and _SPECIAL_IDS.keys().isdisjoint(ids)
            ):
                _explain_bad_ids(part, ids)  # raises, naming the first bad id
                ids = [int(t) for t in ids]  # numpy integers -> plain ints
            # a private copy: mutating the caller's list later must not change the example
            object.__setattr__(self, part, list(ids))

    @classmethod
    def from_text(cls, prompt_text: str, response_text: str, task: str = "custom") -> Example:
        """Build an example from text (strict encoding: unknown characters raise)."""
        return cls(
            prompt=encode_strict(prompt_text),
            response=encode_strict(response_text),
            task=task,
            prompt_text=prompt_text,
            response_text=response_text,
        )

    @property
    def tokens(self) -> list[int]:
        """The training sequence: ``[<bos>] + prompt + response + [<eos>]``."""
        return [BOS_ID, *self.prompt, *self.response, EOS_ID]

    @property
    def n_prompt(self) -> int:
        """Prompt length in ``tokens``, ``<bos>`` included: ``1 + len(prompt)``."""
        return 1 + len(self.prompt)

    @property
    def n_response(self) -> int:
        """Tokens after the prompt, ``<eos>`` included: ``len(response) + 1``."""
        return len(self.response) + 1

    @property
    def text(self) -> str:
        """Prompt text followed by response text (no special tokens)."""
        return self.prompt_text + self.response_text

    def __len__(self) -> int:
        return len(self.prompt) + len(self.response) + 2


# ---------------------------------------------------------------------------------------------
# tasks


@dataclass(frozen=True)
class Task:
    """A synthetic task: ``generate(rng)`` returns ``(prompt_text, response_text)``."""

    name: str
    description: str
    generate: Callable[[random.Random], tuple[str, str]]


def _gen_reverse(rng: random.Random) -> tuple[str, str]:
    s = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 7)))
    return f"rev {s}=", s[::-1]


def _gen_add(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randrange(100), rng.randrange(100)
    return f"add {a}+{b}=", str(a + b)


def _gen_sort(rng: random.Random) -> tuple[str, str]:
    digits = rng.choices(string.digits, k=rng.randint(3, 7))
    return f"sort {''.join(digits)}=", "".join(sorted(digits))


def _gen_kv(rng: random.Random) -> tuple[str, str]:
    keys = rng.sample(string.ascii_lowercase, k=rng.randint(3, 5))
    values = [str(rng.randrange(10)) for _ in keys]
    query = rng.randrange(len(keys))
    pairs = ",".join(f"{k}:{v}" for k, v in zip(keys, values, strict=True))
    return f"{pairs}?{keys[query]}=", values[query]


def _copy_texts(rng: random.Random, n_copy: int, n_extra: int) -> tuple[str, str]:
    head = "".join(rng.choices(string.ascii_lowercase, k=n_copy))
    tail = "".join(rng.choices(string.ascii_lowercase, k=n_extra))
    return f"{head}|{tail}>", head


def _gen_copy(rng: random.Random) -> tuple[str, str]:
    return _copy_texts(rng, rng.randint(3, 7), rng.randint(0, 5))


TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task("reverse", "reverse 3-7 letters: 'rev abcde=' -> 'edcba'", _gen_reverse),
        Task("add", "add two numbers below 100: 'add 12+34=' -> '46'", _gen_add),
        Task("sort", "sort 3-7 digits: 'sort 5132=' -> '1235'", _gen_sort),
        Task("kv", "look up a key among 3-5 pairs: 'a:1,b:7,c:3?b=' -> '7'", _gen_kv),
        Task("copy", "repeat the letters before '|': 'abc|xyzw>' -> 'abc'", _gen_copy),
    )
}

DEFAULT_TASKS: tuple[str, ...] = ("reverse", "add", "sort", "kv")


def _check_n(n, what: str = "n", allow_zero: bool = False) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise PacksimError(f"{what} must be an int, got {n!r}; pass a whole number of examples.")
    if n < 0 or (n == 0 and not allow_zero):
        low = "0" if allow_zero else "1"
        raise PacksimError(f"{what}={n} is too small; pass {what} >= {low}.")
    return int(n)


def _check_tasks(tasks) -> tuple[str, ...]:
    if isinstance(tasks, str):
        tasks = (tasks,)
    tasks = tuple(tasks)
    if not tasks:
        raise PacksimError(f"tasks is empty; pass at least one of {sorted(TASKS)}.")
    for name in tasks:
        if name not in TASKS:
            raise PacksimError(f"unknown task {name!r}; choose from {sorted(TASKS)}.")
    return tasks


def _draw(rng: random.Random, tasks: tuple[str, ...]) -> Example:
    name = rng.choice(tasks)
    prompt_text, response_text = TASKS[name].generate(rng)
    return Example.from_text(prompt_text, response_text, task=name)


def make_examples(
    n: int, tasks: str | Iterable[str] = DEFAULT_TASKS, seed: int = 0
) -> list[Example]:
    """``n`` i.i.d. examples, each task drawn uniformly from ``tasks``; same seed, same list.

    Example::

        >>> import packsim
        >>> examples = packsim.make_examples(3, seed=0)
        >>> len(examples), examples == packsim.make_examples(3, seed=0)
        (3, True)
    """
    n = _check_n(n)
    tasks = _check_tasks(tasks)
    rng = random.Random(seed)
    return [_draw(rng, tasks) for _ in range(n)]


_TEST_BUCKETS = 10  # one prompt in ten (by a fixed hash of its text) is reserved for test sets


def _is_test_prompt(prompt_text: str) -> bool:
    return zlib.crc32(prompt_text.encode()) % _TEST_BUCKETS == 0


def make_dataset(
    n_train: int, n_test: int, seed: int = 0, tasks: str | Iterable[str] = DEFAULT_TASKS
) -> tuple[list[Example], list[Example]]:
    """A train list and a held-out test list whose prompts never occur in train.

    Prompts are split by a fixed hash of their text (about one in ten is test-only), so the
    split holds across seeds and sizes too: no test prompt of any call is a train prompt of
    any call. Test prompts are distinct; train examples are i.i.d. (repeats possible).
    """
    n_train = _check_n(n_train, "n_train")
    n_test = _check_n(n_test, "n_test", allow_zero=True)
    tasks = _check_tasks(tasks)

    rng = random.Random(f"packsim-train-{seed}")
    train: list[Example] = []
    while len(train) < n_train:
        ex = _draw(rng, tasks)
        if not _is_test_prompt(ex.prompt_text):
            train.append(ex)

    rng = random.Random(f"packsim-test-{seed}")
    test: list[Example] = []
    seen: set[str] = set()
    misses = 0  # draws in a row that found no new test prompt: stop when the space is used up
    while len(test) < n_test and misses < 50_000:
        ex = _draw(rng, tasks)
        if _is_test_prompt(ex.prompt_text) and ex.prompt_text not in seen:
            seen.add(ex.prompt_text)
            test.append(ex)
            misses = 0
        else:
            misses += 1
    if len(test) < n_test:
        raise PacksimError(
            f"found only {len(test)} distinct held-out prompts for tasks {list(tasks)} "
            f"(asked for n_test={n_test}); lower n_test or add more tasks."
        )
    return train, test


# ---------------------------------------------------------------------------------------------
# lengths


def long_tailed_lengths(
    n: int,
    median: float = 90,
    sigma: float = 0.9,
    max_len: int = 2048,
    min_len: int = 8,
    seed: int = 0,
) -> np.ndarray:
    """``n`` integer lengths from a lognormal with the given median, clipped to [min_len, max_len].

    Most sequences are short and a few are very long, like real SFT data. ``sigma`` is the
    spread of log-length (0.9: the 90th percentile is about 3.2x the median). Returns int64.
    """
    n = _check_n(n)
    if not 1 <= min_len <= max_len:
        raise PacksimError(
            f"need 1 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}; fix the bounds."
        )
    if not min_len <= median <= max_len:
        raise PacksimError(
            f"median={median} is outside [min_len={min_len}, max_len={max_len}]; "
            "pick a median between the bounds."
        )
    if not sigma >= 0:
        raise PacksimError(f"sigma={sigma} must be >= 0 (0 gives every length = median).")
    rng = np.random.default_rng(seed)
    raw = rng.lognormal(mean=math.log(median), sigma=sigma, size=n)
    return np.clip(np.rint(raw), min_len, max_len).astype(np.int64)


def uniform_lengths(n: int, low: int, high: int, seed: int = 0) -> np.ndarray:
    """``n`` integer lengths uniform on ``[low, high]`` (both ends included). Returns int64."""
    n = _check_n(n)
    if not 1 <= low <= high:
        raise PacksimError(f"need 1 <= low <= high, got low={low}, high={high}; fix the bounds.")
    rng = np.random.default_rng(seed)
    return rng.integers(low, high, size=n, endpoint=True, dtype=np.int64)


# ---------------------------------------------------------------------------------------------
# examples of chosen lengths (throughput studies)

MIN_COPY_LEN = 6  # <bos> + 'a|>' + 'a' + <eos>


def examples_with_lengths(
    lengths: Iterable[int], seed: int = 0, response_frac: float = 0.3
) -> list[Example]:
    """One ``copy`` example per entry, with ``len(example) == length`` exactly.

    Layout for a length ``L``: ``<bos> head|tail> head <eos>``; the response (``head``) gets
    about ``response_frac * L`` tokens (at least 1, at most ``(L - 4) // 2``), ``tail`` fills
    the rest of the prompt. Lengths must be >= 6.
    """
    lengths = [int(x) for x in np.asarray(list(lengths)).reshape(-1)]
    if not lengths:
        raise PacksimError(
            "lengths is empty; pass at least one length (e.g. long_tailed_lengths(100))."
        )
    if not 0 < response_frac < 0.5:
        raise PacksimError(
            f"response_frac={response_frac} must be in (0, 0.5): the copy task's response repeats "
            "part of its prompt, so it is always under half of the tokens. Try 0.3."
        )
    short = [x for x in lengths if x < MIN_COPY_LEN]
    if short:
        raise PacksimError(
            f"length {short[0]} is below {MIN_COPY_LEN}, the shortest copy example "
            "(<bos> a|> a <eos>); raise min_len to at least 6."
        )
    rng = random.Random(seed)
    out = []
    for length in lengths:
        n_copy = min(max(1, round(response_frac * length)), (length - 4) // 2)
        prompt_text, response_text = _copy_texts(rng, n_copy, length - 4 - 2 * n_copy)
        out.append(Example.from_text(prompt_text, response_text, task="copy"))
    return out


def make_long_tailed_examples(
    n: int,
    seed: int = 0,
    median: float = 90,
    sigma: float = 0.9,
    max_len: int = 2048,
    min_len: int = 8,
    response_frac: float = 0.3,
) -> list[Example]:
    """``n`` copy examples whose lengths are ``long_tailed_lengths(n, median, sigma, max_len,
    min_len, seed)``, exactly (see :func:`examples_with_lengths` for the layout)."""
    lengths = long_tailed_lengths(
        n, median=median, sigma=sigma, max_len=max_len, min_len=min_len, seed=seed
    )
    return examples_with_lengths(lengths, seed=seed, response_frac=response_frac)
