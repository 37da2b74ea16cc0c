"""Checks for notebook 08_flash_varlen_internals: tiles a varlen kernel computes, and why.

Three exercises:

- ``count_tiles(lengths, tile)``: how many (query tile, key tile) pairs a flash-style varlen
  kernel computes for a causal pack (tiles start at each sequence's own offset);
- ``work_ratio(lengths)``: the share of a dense N x N score matrix that per-sequence attention
  computes, sum L_i^2 / N^2;
- ``classify_tiles(lengths, tile)``: the pack-aligned tile map FlexAttention's BlockMask stores:
  0 skipped, 1 partial (mask applied per element), 2 full (no mask needed).

Each check compares the learner's answer with an independent oracle (packsim's work accounting,
or a real FlexAttention ``BlockMask`` built by torch) and names the typical mistakes: counting
tiles above the diagonal, ignoring example boundaries, off-by-one at tile edges. The form is
free: a count may be an int, a whole float, a numpy or 0-d tensor integer; a ratio any real within
1e-6 relative or 5e-5 absolute (4 decimals), causal-vs-causal as well as square-vs-square; a tile
map a tensor, numpy array or nested list of any integer (or whole float) dtype.
"""

from __future__ import annotations

import math
import numbers

import torch

from packsim.core.masks import block_sparsity, flex_block_mask
from packsim.core.segments import cu_seqlens_from_lengths, seq_ids_from_cu_seqlens
from packsim.core.tiles import attention_work
from packsim.course.exercises import Feedback, check, fail, ok

__all__ = ["check_count_tiles", "check_work_ratio", "check_classify_tiles"]

BLOG_MIX = [100, 300, 28, 340, 256]  # the FlexAttention blog's document example (1024 tokens)

# (lengths, tile): chosen so that each typical mistake gives a different number
COUNT_CASES = [
    (BLOG_MIX, 128),
    ([128, 256], 128),  # exact multiples of the tile
    ([1, 1, 1], 64),  # tiny sequences: one (partial) tile each
    ([129, 127, 256, 40], 64),
    ([700], 128),  # a single sequence: varlen = causal over the pack
]
RATIO_CASES = [BLOG_MIX, [512], [64] * 16, [1000, 10, 10, 4]]
CLASSIFY_CASES = [
    (BLOG_MIX, 128),
    ([64, 64, 128], 64),  # boundaries on tile edges: some off-diagonal tiles are full
    ([100, 60], 64),  # a boundary inside a tile and a ragged last tile
    ([129, 127, 256, 40], 64),
]


def _tri(n: int) -> int:
    return n * (n + 1) // 2


def _as_int(value, what: str) -> int | Feedback:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
            return int(value)
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return fail(
            f"{what} returned {value!r} ({type(value).__name__}); expected a whole number of tiles.",
            "return an int, e.g. sum(...) over the sequences.",
        )
    return int(value)


# ----------------------------------------------------------------------------- count_tiles


def _count_mistakes(lengths: list[int], tile: int, got: int) -> str | None:
    """Name the typical mistake that produces ``got`` for this case (None: not a known one)."""
    N = sum(lengths)
    n_pack = math.ceil(N / tile)
    work = attention_work(cu_seqlens_from_lengths(lengths), causal=True, tile=tile)
    known = [
        (
            sum(math.ceil(L / tile) ** 2 for L in lengths),
            "You counted every key tile of each sequence, including those above the diagonal. "
            "In a causal kernel a query tile stops at its own diagonal tile: key tiles to its right "
            "hold only future tokens and are never loaded.",
        ),
        (
            _tri(n_pack),
            "You tiled the whole pack as one long sequence, ignoring the example boundaries: that "
            "is the work of the leaky causal kernel over the pack, not of a varlen kernel.",
        ),
        (
            n_pack**2,
            "You counted the dense N x N grid: every tile of the pack, nothing skipped.",
        ),
        (
            work.tiles_computed,
            "You counted the pack-aligned grid (FlexAttention's view, tiles starting every "
            f"{tile} tokens of the pack). A varlen kernel starts its tiles at each sequence's own "
            "offset (cu_seqlens), so no tile straddles two sequences.",
        ),
        (
            sum(_tri(L // tile) for L in lengths),
            "You used floor division: the last, shorter tile of each sequence went missing (and a "
            "sequence shorter than a tile got no tile at all).",
        ),
        (
            sum(_tri(L // tile + 1) for L in lengths),
            "You added one tile to every sequence, even when its length is an exact multiple of "
            "the tile; ceil(L / tile) tiles cover L tokens.",
        ),
    ]
    for value, why in known:
        if got == value and value != work.varlen_tiles:
            return why
    return None


@check("count the tiles a varlen kernel computes")
def check_count_tiles(count_tiles) -> Feedback:
    """``count_tiles(lengths, tile) -> int``: (q-tile, k-tile) pairs of a causal varlen kernel."""
    for lengths, tile in COUNT_CASES:
        got = _as_int(count_tiles(list(lengths), tile), f"count_tiles({lengths}, {tile})")
        if isinstance(got, Feedback):
            return got
        want = attention_work(cu_seqlens_from_lengths(lengths), causal=True, tile=tile).varlen_tiles
        if got != want:
            why = _count_mistakes(lengths, tile, got)
            return fail(
                f"count_tiles({lengths}, tile={tile}) returned {got}, expected {want}. "
                + (why or "That is not one of the usual slips; recount by hand for this case."),
                "per sequence: n = ceil(L / tile) query tiles; query tile i computes key tiles "
                "0..i (causal), so n(n+1)/2 tiles; add them up over the sequences.",
            )
    lengths, tile = COUNT_CASES[0]
    n_tiles = attention_work(cu_seqlens_from_lengths(lengths), tile=tile).varlen_tiles
    return ok(
        f"right on all {len(COUNT_CASES)} packs: e.g. {lengths} in tiles of {tile} needs "
        f"{n_tiles} tiles, each inside one sequence."
    )


# ----------------------------------------------------------------------------- work_ratio


@check("the share of dense work varlen does")
def check_work_ratio(work_ratio) -> Feedback:
    """``work_ratio(lengths) -> float``: sum L_i^2 / N^2 (score pairs, varlen over dense)."""
    for lengths in RATIO_CASES:
        got = work_ratio(list(lengths))
        try:
            got = float(got)
        except (TypeError, ValueError):
            return fail(
                f"work_ratio({lengths}) returned {got!r}; expected a float.",
                "return sum(L * L for L in lengths) / N**2 as a Python float.",
            )
        w = attention_work(cu_seqlens_from_lengths(lengths), causal=False)
        want = w.varlen_pairs / w.dense_pairs
        causal = attention_work(cu_seqlens_from_lengths(lengths), causal=True)
        also_right = causal.varlen_pairs / causal.pack_pairs  # causal vs causal: fine too
        if any(math.isclose(got, w, rel_tol=1e-6, abs_tol=5e-5) for w in (want, also_right)):
            continue
        N = sum(lengths)
        if math.isclose(got, 1.0) and want < 1:
            why = "You got 1: did you square the total, (sum L)^2 / N^2? Square each length first."
        elif want > 0 and math.isclose(got, 1 / want, rel_tol=1e-6):
            why = "You returned the inverse, N^2 / sum L^2 (the saving), not the share."
        elif math.isclose(got, causal.varlen_pairs / w.dense_pairs, rel_tol=1e-6):
            why = (
                "You counted causal pairs L(L+1)/2 for varlen but all N^2 pairs for dense: compare "
                "like with like (both full squares, or both causal triangles)."
            )
        elif math.isclose(got, len(lengths) / N, rel_tol=1e-6) or math.isclose(
            got, 1 / len(lengths), rel_tol=1e-6
        ):
            why = "That only depends on the number of sequences, not on their lengths."
        elif math.isclose(got, sum(L * L for L in lengths) / N, rel_tol=1e-6):
            why = "You divided sum L^2 by N, not by N^2: the dense matrix has N x N score pairs."
        elif math.isclose(got, max(lengths) ** 2 / N**2, rel_tol=1e-6):
            why = "You squared only the longest sequence: every sequence adds its own L^2."
        elif got > 1:
            why = (f"A share of the dense work cannot exceed 1; you returned {got:.6g} "
                   f"(sum L^2 = {sum(L * L for L in lengths):,}, N^2 = {N * N:,}).")
        else:
            why = (f"Your value is {got / want if want else float('inf'):.3g} times the right one: for "
                   f"these lengths sum L^2 = {sum(L * L for L in lengths):,} and N^2 = {N * N:,} "
                   f"(N = {N}), so the share is {want:.6g}.")
        return fail(
            f"work_ratio({lengths}) returned {got:.6g}, expected {want:.6g}. {why}",
            "a varlen kernel scores L_i x L_i pairs per sequence; dense scores N x N with "
            "N = sum(lengths). Return sum(L**2) / N**2.",
        )
    w = attention_work(cu_seqlens_from_lengths(RATIO_CASES[2]), causal=False)
    return ok(
        f"right on all {len(RATIO_CASES)} mixes. Note the pattern: S equal sequences give 1/S "
        f"({RATIO_CASES[2][0]} x {len(RATIO_CASES[2])} -> {w.varlen_pairs / w.dense_pairs:.4f}), "
        "and one long sequence dominates the sum."
    )


# ----------------------------------------------------------------------------- classify_tiles


def _flex_grid(lengths: list[int], tile: int) -> torch.Tensor:
    """The oracle: torch's own FlexAttention BlockMask for the pack, as (n, n) int8 codes."""
    ids = seq_ids_from_cu_seqlens(cu_seqlens_from_lengths(lengths))  # (N,)
    return block_sparsity(flex_block_mask(ids, causal=True, block_size=tile)).grid[0, 0]


def _tile_span(i: int, tile: int, N: int) -> str:
    return f"tokens {i * tile}..{min((i + 1) * tile, N) - 1}"


_CODE = {0: "skipped", 1: "partial", 2: "full"}


def _cell_mistake(i: int, j: int, want: int, got: int, lengths, tile: int) -> str:
    N = sum(lengths)
    where = (
        f"tile (query {i}, key {j}) = queries {_tile_span(i, tile, N)}, keys {_tile_span(j, tile, N)}"
    )
    head = f"{where}: you marked it {_CODE.get(got, got)!s}, it is {_CODE[want]}."
    if want == 0 and j > i:
        return head + " It lies above the diagonal: every key in it is in the future of every query."
    if want == 0:
        return head + (
            " Its queries and keys belong to different examples, so no pair may attend: a "
            "document mask skips it (cross-example tiles are never computed)."
        )
    if want == 1 and got == 2 and i == j:
        return head + (
            " A diagonal tile is cut in half by the causal mask: it is computed, with the mask "
            "applied per element."
        )
    if want == 1 and got == 2:
        return head + (
            " An example boundary runs through it (or it is the ragged last tile), so some pairs "
            "are allowed and some are not: it needs the mask per element."
        )
    if want == 2:
        return head + (
            " Queries and keys all belong to one example and every key is before every query: "
            "all pairs are allowed, so the kernel can skip evaluating the mask."
        )
    return head + " Some query in it may attend to some key in it, so it must be computed."


@check("classify the tiles of a pack")
def check_classify_tiles(classify_tiles) -> Feedback:
    """``classify_tiles(lengths, tile) -> (n, n)`` of 0 skipped / 1 partial / 2 full, causal."""
    for lengths, tile in CLASSIFY_CASES:
        raw = classify_tiles(list(lengths), tile)
        try:
            got = torch.as_tensor(raw)
        except (TypeError, ValueError, RuntimeError):
            return fail(
                f"classify_tiles({lengths}, {tile}) returned {type(raw).__name__}; expected an "
                "(n, n) grid of ints (a list of lists or a tensor).",
                "build torch.zeros(n, n, dtype=torch.int8) and fill in 1s and 2s.",
            )
        want = _flex_grid(lengths, tile)  # (n, n)
        n = want.shape[0]
        if tuple(got.shape) != (n, n):
            return fail(
                f"classify_tiles({lengths}, {tile}) has shape {tuple(got.shape)}; {sum(lengths)} "
                f"tokens in tiles of {tile} make an ({n}, {n}) grid.",
                "n = ceil(N / tile): the last tile may be shorter than the others.",
            )
        if got.is_floating_point() or got.dtype == torch.bool:
            got = got.round().long() if got.is_floating_point() else got.long()
        got, want = got.long(), want.long()
        bad = (got != want).nonzero()
        if len(bad):
            # report the most telling mismatch first: work on a skipped tile, then a skipped
            # tile that is needed, then partial/full mix-ups
            order = [
                (want == 0) & (got != 0),
                (want != 0) & (got == 0),
                (want == 1) & (got != 1),
                want != got,
            ]
            i, j = next((int(a), int(b)) for m in order for a, b in m.nonzero()[:1])
            return fail(
                f"classify_tiles({lengths}, tile={tile}): {len(bad)} of {n * n} tiles differ from "
                f"FlexAttention's BlockMask. First one: "
                + _cell_mistake(i, j, int(want[i, j]), int(got[i, j]), lengths, tile),
                "for each tile find the sequence ids its rows and its columns cover; skipped if "
                "they share none or the key tile is right of the query tile; full if both lie "
                "inside the same single sequence, the tile is whole and strictly below the "
                "diagonal; partial otherwise.",
            )
    g = _flex_grid(*CLASSIFY_CASES[0])
    return ok(
        f"your maps match torch's BlockMask on all {len(CLASSIFY_CASES)} packs (e.g. "
        f"{CLASSIFY_CASES[0][0]}: {int((g == 2).sum())} full, {int((g == 1).sum())} partial, "
        f"{int((g == 0).sum())} skipped of {g.numel()})."
    )
