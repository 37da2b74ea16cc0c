"""Tests for packsim.core.pack_wrapped: the compiled loop against an independent numpy version (the
one issue 24 replaced, copied verbatim below), against itself run as plain Python, on random, large
and edge cases; the int32 result when cuts on example starts bring the piece count under the limit."""

from __future__ import annotations

import numpy as np

from packsim.core import pack_wrapped
from packsim.core.packing import pack_arrays

# A verbatim copy of packsim.core.packing._pack_wrapped before issue 24 (a binary search per cut,
# one fresh array per step); the compiled loop must give the same arrays.


def _previous_numpy_wrapped(sizes: np.ndarray, capacity: int) -> tuple[np.ndarray, ...]:
    n = len(sizes)
    if not n:
        return sizes, sizes, sizes, np.zeros(1, dtype=np.int64)
    bounds = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sizes, out=bounds[1:])
    cuts = np.arange(capacity, bounds[-1], capacity, dtype=np.int64)
    after = np.searchsorted(bounds, cuts)
    inside = bounds[after] != cuts
    cut_at = after[inside]
    n_pieces = n + len(cut_at)
    added = cut_at + np.arange(len(cut_at))
    is_added = np.zeros(n_pieces, dtype=np.int64)
    is_added[added] = 1
    index = np.arange(n_pieces) - np.cumsum(is_added)
    piece_start = np.empty(n_pieces + 1, dtype=np.int64)
    np.take(bounds, index, out=piece_start[:-1])
    piece_start[added] = cuts[inside]
    piece_start[-1] = bounds[-1]
    start = np.zeros(n_pieces, dtype=np.int64)
    start[added] = cuts[inside] - bounds[cut_at - 1]
    row_offsets = np.empty(len(cuts) + 2, dtype=np.int64)
    row_offsets[0], row_offsets[-1] = 0, n_pieces
    row_offsets[1:-1] = after + np.cumsum(inside) - inside
    return index, start, np.diff(piece_start), row_offsets


FIELDS = ("index", "start", "length", "row_offsets")


def _same_wrapped(lengths, capacity: int) -> None:
    sizes = np.asarray(lengths, dtype=np.int64)
    got = pack_arrays(sizes, capacity, "wrapped")
    want = _previous_numpy_wrapped(sizes, capacity)
    for name, b in zip(FIELDS, want, strict=True):
        a = getattr(got, name)
        assert a.dtype == np.int32 and np.array_equal(a, b), (name, list(lengths), capacity)


def _edge_cases() -> list[tuple[list[int], int]]:
    """Examples spanning whole rows, cuts on example starts, cuts after the last start, one-token rows."""
    rng = np.random.default_rng(31)
    cases = [([1] * 200 + [35], 10), ([1] * 200 + [35, 1, 1], 10), ([10] * 50, 10), ([3, 40, 2, 2, 2], 8),
             ([7], 1), ([1], 5), ([5], 5), ([6], 5), ([4, 1], 5), ([4, 1, 1], 5)]
    for _ in range(1500):
        capacity = int(rng.integers(1, 30))
        sizes = rng.integers(1, int(rng.choice([2, capacity + 1])), int(rng.integers(1, 80)))
        sizes[rng.integers(0, len(sizes))] = rng.integers(1, 6 * capacity + 1)  # one may span rows
        cases.append((sizes.tolist(), capacity))
    return cases


def test_wrapped_equals_the_previous_numpy_version_on_random_cases():
    """5000 seeded cases: short and long examples, cuts on example starts, one-token rows."""
    rng = np.random.default_rng(24)
    for _ in range(5000):
        capacity = int(rng.integers(1, 40))
        n = int(rng.integers(1, 60))
        high = int(rng.choice([2, capacity + 1, 4 * capacity + 2]))
        _same_wrapped(rng.integers(1, high, n), capacity)
    for capacity in (1, 4, 8):  # every example start on a cut, and every cut on one
        _same_wrapped([capacity] * 7, capacity)
        _same_wrapped([capacity // 2 or 1] * 9, capacity)


def test_wrapped_equals_the_previous_numpy_version_on_edge_cases():
    for lengths, capacity in _edge_cases():
        _same_wrapped(lengths, capacity)


def test_wrapped_equals_the_previous_numpy_version_on_large_mixes():
    rng = np.random.default_rng(7)
    bimodal = np.where(rng.random(50_000) < 0.75, rng.lognormal(4.4, 0.7, 50_000), rng.lognormal(6.5, 0.6, 50_000))
    mixes = (np.clip(np.rint(bimodal), 2, 4096).astype(np.int64), rng.integers(1, 513, 50_000))
    for lengths in mixes:
        for capacity in (512, 2048, 8192):
            _same_wrapped(lengths, capacity)


def test_compiled_loop_equals_the_loop_run_as_plain_python():
    """numba compiles ``_fill_pieces``; run as Python it must write the same arrays (int64 and int32)."""
    for lengths, capacity in _edge_cases()[:300]:
        sizes = np.asarray(lengths, dtype=np.int64)
        n_rows = -(-int(sizes.sum()) // capacity)
        most = len(sizes) + n_rows - 1
        for dtype in (np.int32, np.int64):
            outs = [[np.full(most, -1, dtype), np.full(most, -1, dtype), np.full(most, -1, dtype),
                     np.full(n_rows + 1, -1, dtype)] for _ in range(2)]
            k_python = pack_wrapped._fill_pieces(sizes, capacity, *outs[0])
            k_compiled = pack_wrapped._compiled()(sizes, capacity, *outs[1])
            assert k_python == k_compiled
            for name, a, b in zip(FIELDS, *outs, strict=True):
                assert np.array_equal(a, b), (name, lengths, capacity, dtype)
            assert (outs[0][3] >= 0).all()  # every row offset written


def test_wrapped_is_int32_when_cuts_on_starts_bring_the_pieces_under_the_limit(monkeypatch):
    """The buffer is sized for every cut inside an example (n + n_rows - 1 pieces); when some cuts fall
    on example starts, fewer pieces result, and the dtype follows the real count."""
    from packsim.core import pack_result

    lengths, capacity = [4, 4, 2, 3], 4  # cuts at 4 and 8 on example starts, at 12 inside example 3
    want = _previous_numpy_wrapped(np.asarray(lengths), capacity)
    n_pieces = len(want[0])
    assert n_pieces == 5 and len(lengths) + 3 - 1 == 6  # 5 pieces, room for 6
    monkeypatch.setattr(pack_result, "_INT32_MAX", n_pieces)  # the room is past the limit, the pieces not
    got = pack_arrays(lengths, capacity, "wrapped")
    for name, b in zip(FIELDS, want, strict=True):
        a = getattr(got, name)
        assert a.dtype == np.int32 and np.array_equal(a, b), name


def test_without_a_writable_cache_folder_the_loop_compiles_uncached(monkeypatch):
    """numba raises RuntimeError for ``cache=True`` when no folder can hold its cache; the loop is
    then compiled without one and packs the same."""
    import numba

    real = numba.njit
    asked = []

    def njit(**options):
        asked.append(options.get("cache", False))
        if options.get("cache"):
            raise RuntimeError("cannot cache function '_fill_pieces': no locator available")
        return real(**options)

    pack_wrapped._compiled.cache_clear()
    monkeypatch.setattr(numba, "njit", njit)
    try:
        _same_wrapped([5, 9, 2, 4, 4], 4)
        assert asked == [True, False]
    finally:
        pack_wrapped._compiled.cache_clear()  # the next caller compiles (or loads) with the cache again


def test_lengths_summing_past_int64_are_refused_not_written_past_the_buffer():
    """pack([2**63 - 1, 1], 2**63 - 1, "wrapped") aborted the process (``free(): invalid next size``): the
    sum wrapped to -2**63, the row count to -1, and the loop wrote past its buffer. Run in a child
    process, so that a regression fails this test instead of killing the test run."""
    import subprocess
    import sys

    script = (
        "import numpy as np\n"
        "from packsim.core.errors import PacksimError\n"
        "from packsim.core.pack_wrapped import wrapped_arrays\n"
        "from packsim.core.packing import pack\n"
        "for call in (lambda: pack([2**63 - 1, 1], 2**63 - 1, 'wrapped'),\n"
        "             lambda: wrapped_arrays(np.array([2**63 - 1, 1], dtype=np.int64), 2**63 - 1)):\n"
        "    try:\n"
        "        call()\n"
        "    except PacksimError as err:\n"
        "        print(err)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith(f"the 2 lengths sum to {2**63} tokens, past 2**63 - 1")
                                   for line in lines), lines


def _python_int_wrapped(lengths: list[int], capacity: int) -> list[list[tuple[int, int, int]]]:
    """Rows of (example, start, stop) in Python ints: example i spans [a, b) of the token stream, rows
    a // capacity .. (b - 1) // capacity each hold its part (exact at any size, unlike int64 or float)."""
    rows: list[list[tuple[int, int, int]]] = [[] for _ in range(-(-sum(lengths) // capacity))]
    a = 0
    for i, n in enumerate(lengths):
        for r in range(a // capacity, (a + n - 1) // capacity + 1):
            lo, hi = max(a, r * capacity), min(a + n, (r + 1) * capacity)
            rows[r].append((i, lo - a, hi - a))
        a += n
    return rows


def test_wrapped_at_exactly_int64_matches_python_ints():
    """2**63 - 1 tokens in all, the most an int64 offset holds (int64 arrays: examples past int32).
    The numpy version above is no ground truth there: np.arange sizes its cuts in float and drops one."""
    for lengths, capacity in (([2**63 - 2, 1], 2**62), ([2**62, 2**62 - 1], 2**62 - 1), ([2**63 - 1], 2**61 + 3),
                              ([2**31 - 1] * 3 + [2**63 - 1 - 3 * (2**31 - 1)], 2**62 + 7)):
        got = pack_arrays(lengths, capacity, "wrapped")
        assert got.index.dtype == np.int64
        rows = [[(p.index, p.start, p.stop) for p in row] for row in got.to_pieces()]
        assert rows == _python_int_wrapped(lengths, capacity), (lengths, capacity)
