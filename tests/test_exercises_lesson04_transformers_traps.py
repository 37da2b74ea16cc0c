"""The checks of notebook 04_transformers_traps and its appendix A3: the references pass, typical mistakes are named."""

from __future__ import annotations

import pytest
import torch

from packsim.course.exercises.lesson04_transformers_traps import (
    HYBRID_CASES,
    check_mrope_position_ids,
    check_position_ids_from_lengths,
    check_seq_idx_from_position_ids,
    mrope_isolation,
    seq_idx_isolation,
)
from packsim.course.solutions import lesson04_transformers_traps as sol


def _text(fb) -> str:
    return f"{fb.message} {fb.hint}".lower()


def test_positions_continuous():
    fb = check_position_ids_from_lengths(lambda ls: torch.arange(sum(ls)))
    assert not fb.passed and "restart" in _text(fb)


def test_positions_start_at_one():
    fb = check_position_ids_from_lengths(lambda ls: torch.cat([torch.arange(1, n + 1) for n in ls]))
    assert not fb.passed and "start at 1" in _text(fb)


def test_positions_float_dtype():
    fb = check_position_ids_from_lengths(lambda ls: sol.position_ids_from_lengths(ls).float())
    assert not fb.passed and "torch.long" in _text(fb)


# ---- appendix A3: seq_idx for a Mamba2 hybrid, mRoPE position ids -----------------------------

def _positions(lengths) -> torch.Tensor:  # (1, T): 0..L-1 per example, written out by hand
    out = []
    for n in lengths:
        out += list(range(n))
    return torch.tensor([out])


def _example_index(lengths) -> list[int]:  # the example each token belongs to, by a plain loop
    out = []
    for i, n in enumerate(lengths):
        out += [i] * n
    return out


def _loop_seq_idx(position_ids):  # a correct answer written differently: a Python loop over tokens
    ids, k = [], -1
    for p in position_ids[0].tolist():
        k += p == 0
        ids.append(k)
    return torch.tensor([ids], dtype=torch.int32)


def _diff_seq_idx(position_ids):  # another: a new example wherever the position fails to go up by 1
    starts = position_ids.diff(dim=-1) != 1  # (1, T-1)
    return torch.cat([torch.zeros_like(position_ids[:, :1]), starts.cumsum(-1)], -1).to(torch.int32)


def test_seq_idx_reference_is_the_example_index_and_the_collators():
    from transformers import DataCollatorWithFlattening

    for lengths in HYBRID_CASES:
        got = sol.seq_idx_from_position_ids(_positions(lengths))
        collated = DataCollatorWithFlattening(return_seq_idx=True)([{"input_ids": [5] * n} for n in lengths])
        assert got.dtype == torch.int32 and got.shape == (1, sum(lengths))
        assert got[0].tolist() == _example_index(lengths) == collated["seq_idx"][0].tolist()
        assert collated["seq_idx"].dtype == torch.int32


@pytest.mark.parametrize("answer", [sol.seq_idx_from_position_ids, _loop_seq_idx, _diff_seq_idx])
def test_seq_idx_correct_answers_pass_and_isolate(answer):
    fb = check_seq_idx_from_position_ids(answer)
    assert fb.passed, fb
    assert "isolated" in fb.message and "leaks" in fb.message  # with seq_idx, and without it


def _late(p):  # each example's first token keeps the previous example's id
    s = sol.seq_idx_from_position_ids(p)
    return torch.cat([s[:, :1], s[:, :-1]], 1)


def _early(p):  # the id changes on the last token of the previous example
    s = sol.seq_idx_from_position_ids(p)
    return torch.cat([s[:, 1:], s[:, -1:]], 1)


def _drops(p):  # a new example only where the position goes down: misses one-token examples
    down = (p[:, 1:] < p[:, :-1]).cumsum(-1)
    return torch.cat([torch.zeros_like(p[:, :1]), down], 1).to(torch.int32)


@pytest.mark.parametrize(("answer", "named"), [
    (lambda p: sol.seq_idx_from_position_ids(p).long(), "int32"),
    (lambda p: (p == 0).cumsum(-1).to(torch.int32), "start at 1"),
    (lambda p: p.to(torch.int32), "position ids themselves"),
    (lambda p: torch.arange(p.shape[-1], dtype=torch.int32)[None], "count every token"),
    (lambda p: torch.zeros_like(p, dtype=torch.int32), "one example for the whole row"),
    (_late, "one token late"),
    (_early, "one token early"),
    (_drops, "one-token example"),
    (lambda p: sol.seq_idx_from_position_ids(p)[0], "(1, 32)"),
], ids=["int64", "starts_at_1", "positions", "token_index", "no_boundary", "late", "early", "drops", "no_batch"])
def test_seq_idx_wrong_answers_are_named(answer, named):
    fb = check_seq_idx_from_position_ids(answer)
    assert not fb.passed and fb.attempted, fb
    assert named in fb.message, fb


def test_seq_idx_leaks_are_measured_on_the_bamba_run():
    fb = check_seq_idx_from_position_ids(lambda p: torch.zeros_like(p, dtype=torch.int32))
    assert "LEAKS" in fb.message
    fb = check_seq_idx_from_position_ids(lambda p: sol.seq_idx_from_position_ids(p).long())
    assert "isolated" in fb.message  # the reference kernels read int64: only the dtype check catches it


def test_seq_idx_isolation_is_the_frontier_cells():
    """The check's run against the trap table's own cell (its own model and batch): the same numbers."""
    from packsim.exhibits.hybrid_traps import FRONTIER_TOL, build_frontier, frontier_cell

    lengths = HYBRID_CASES[0]
    bamba = build_frontier("bamba")
    truth = torch.tensor([_example_index(lengths)], dtype=torch.int32)
    ours, none = max(seq_idx_isolation(truth)), max(seq_idx_isolation(None))
    with_idx = frontier_cell(bamba, "bamba", "seq_idx", run_audit=False)
    positions = frontier_cell(bamba, "bamba", "positions", run_audit=False)
    assert ours == pytest.approx(with_idx.change, abs=1e-9) and ours <= FRONTIER_TOL["hybrid"]
    assert none == pytest.approx(positions.change, rel=1e-6) and none > 1e3 * FRONTIER_TOL["hybrid"]


@pytest.mark.parametrize("answer", [
    sol.mrope_position_ids,
    lambda p: torch.stack([p, p, p, p]),
    lambda p: p.unsqueeze(0).repeat(4, 1, 1),
], ids=["reference", "stack", "repeat"])
def test_mrope_correct_answers_pass_and_isolate(answer):
    fb = check_mrope_position_ids(answer)
    assert fb.passed, fb
    assert "isolated" in fb.message and "leaks" in fb.message  # four rows, and three rows


def test_mrope_reference_rows_are_the_text_positions():
    for lengths in HYBRID_CASES:
        got = sol.mrope_position_ids(_positions(lengths))
        assert got.shape == (4, 1, sum(lengths)) and got.dtype == torch.long
        want = [p for n in lengths for p in range(n)]
        assert all(got[r, 0].tolist() == want for r in range(4))


def _arange(p):
    return torch.arange(p.shape[-1])[None]  # (1, T): 0..T-1, continuing across examples


@pytest.mark.parametrize(("answer", "named", "measured"), [
    (lambda p: p, "(1, 32)", "LEAKS"),
    (lambda p: p[None].expand(3, -1, -1), "three rows", "LEAKS"),
    (lambda p: _arange(p)[None].expand(4, -1, -1), "continues across examples", "LEAKS"),
    (lambda p: torch.cat([_arange(p)[None], p[None].expand(3, -1, -1)]), "text row", "LEAKS"),
    (lambda p: torch.cat([p[None], _arange(p)[None].expand(3, -1, -1)]), "rope row 1", "isolated"),
    (lambda p: p.expand(4, -1), "(4, 1, 32)", None),
    (lambda p: sol.mrope_position_ids(p).int(), "torch.long", None),
], ids=["2d", "three_rows", "all_continue", "text_continues", "rope_continues", "no_batch", "int32"])
def test_mrope_wrong_answers_are_named(answer, named, measured):
    fb = check_mrope_position_ids(answer)
    assert not fb.passed and fb.attempted, fb
    assert named in fb.message, fb
    if measured:
        assert f"), {measured}" in fb.message, fb


def test_mrope_isolation_is_the_frontier_cells():
    from packsim.exhibits.hybrid_traps import FRONTIER_TOL, build_frontier, frontier_cell

    lengths = HYBRID_CASES[0]
    vl = build_frontier("qwen2_vl")
    pos = _positions(lengths)
    four, three = max(mrope_isolation(pos[None].expand(4, 1, -1))), max(mrope_isolation(pos[None].expand(3, 1, -1)))
    assert four == pytest.approx(frontier_cell(vl, "qwen2_vl", "positions_4rows", run_audit=False).change, abs=1e-9)
    assert three == pytest.approx(frontier_cell(vl, "qwen2_vl", "positions_3d", run_audit=False).change, rel=1e-6)
    assert four <= FRONTIER_TOL["mrope"] < three


def test_positions_other_right_answers_pass():
    def minus_starts(ls):  # one arange over the pack minus each token's example start
        lengths = torch.tensor(ls)
        starts = torch.cumsum(lengths, 0) - lengths
        return torch.arange(int(lengths.sum())) - torch.repeat_interleave(starts, lengths)

    def from_a_list(ls):  # a Python loop, then one tensor
        return torch.tensor([p for n in ls for p in range(n)], dtype=torch.long)

    def batch_of_one(ls):  # (1, N): the shape a transformers batch carries
        return sol.position_ids_from_lengths(ls)[None]

    for fn in (minus_starts, from_a_list, batch_of_one):
        fb = check_position_ids_from_lengths(fn)
        assert fb.passed, (fn.__name__, fb)


def test_positions_list_and_wrong_count_are_named():
    fb = check_position_ids_from_lengths(lambda ls: [p for n in ls for p in range(n)])
    assert not fb.passed and "torch.long tensor" in _text(fb)
    fb = check_position_ids_from_lengths(lambda ls: torch.cat([torch.arange(n - 1) for n in ls]))
    assert not fb.passed and "positions for" in _text(fb)
