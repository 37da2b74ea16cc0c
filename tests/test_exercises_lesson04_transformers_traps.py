"""The checks of notebook 04_transformers_traps and its appendix A3: the references pass, typical mistakes are named."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch

from packsim.course.cases import lesson04_backend_cases as bc
from packsim.course.exercises.lesson04_transformers_traps import (
    HYBRID_CASES,
    check_forward_kwargs_for,
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


# ---- step 2: forward_kwargs_for, run on every backend ----------------------------------------
# Ground truth by the test's own loop: its own tiny Llama per backend (the trap table's config,
# use_cache=True as LlamaConfig gives it), its own packed forward and its own run of each example
# alone; the check's verdict must be "passed" exactly when every case is isolated here.

FLASH = "flash_attention_2"


@functools.cache
def _truth_model(impl):
    from packsim.exhibits.trap_cases import build_family
    from packsim.reference.flash_emulation import emulate_flash

    model = build_family("llama", "eager")
    assert model.config.use_cache is True  # the default a hand-written loop gets
    model.set_attn_implementation(emulate_flash(force_reference=True).name if impl == FLASH else impl)
    return model


def _truth(fields, impl, rows) -> float:
    """Max |packed - alone| over every example of the case (inf if the forward raises)."""
    from packsim.exhibits.traps import _flex_mode  # flex uncompiled on CPU (the same masking code)

    model, B = _truth_model(impl), len(rows)
    gen = torch.Generator().manual_seed(sum(len(r) for r in rows))  # the check's tokens, drawn the same way
    ids = torch.randint(3, 96, (B, 32), generator=gen)
    worst = 0.0
    with _flex_mode(impl != "flex_attention"), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            packed = model(input_ids=ids, **fields).logits
        except Exception:  # noqa: BLE001 - fields the backend cannot run: not isolated
            return float("inf")
        for b, row in enumerate(rows):
            start = 0
            for n in row:
                alone = model(input_ids=ids[b : b + 1, start : start + n], use_cache=False).logits[0]
                d = float((packed[b, start : start + n] - alone).abs().max())
                worst = max(worst, d if d == d else float("inf"))
                start += n
    return worst


def _truth_by_case(answer) -> dict:
    return {(impl, rows): _truth(answer([list(r) for r in rows], impl), impl, rows) for impl, rows in bc.KWARGS_CASES}


def _restart(rows):  # (B, 32) position ids, 0..L-1 per example, by a plain loop
    return torch.tensor([[p for n in row for p in range(n)] for row in rows])


def _varlen(rows):  # cu_seq_lens over the flattened batch (S+1,) int32, and the longest example
    cu, total = [0], 0
    for row in rows:
        for n in row:
            total += n
            cu.append(total)
    cu, longest = torch.tensor(cu, dtype=torch.int32), max(n for row in rows for n in row)
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu.clone(), "max_length_q": longest, "max_length_k": longest}


def _block_diagonal(rows):  # (B, 1, 32, 32) bool, True = attend: same example and key <= query
    seq = torch.tensor([[e for e, n in enumerate(row) for _ in range(n)] for row in rows])
    q, k = torch.arange(32)[:, None], torch.arange(32)[None]
    return ((seq[:, :, None] == seq[:, None, :]) & (k <= q))[:, None]


def _additive(rows):
    return torch.where(_block_diagonal(rows), 0.0, torch.finfo(torch.float32).min)


def _collator_everywhere(rows, impl):  # what DataCollatorWithFlattening(return_flash_attn_kwargs=True) carries
    return {"position_ids": _restart(rows), "use_cache": False, **_varlen(rows)}


def _masks_and_boundaries(rows, impl):  # a float 4D mask (the cache does not matter then); flash: offsets only
    if impl == FLASH:
        return _varlen(rows)  # no positions (0..31 per row: RoPE reads differences), use_cache left on
    return {"attention_mask": _additive(rows)}


def _mixed(rows, impl):  # bool 4D on sdpa; float 4D + continuous positions on eager/flex; flash: ones mask dropped
    if impl == "sdpa":
        return {"attention_mask": _block_diagonal(rows), "use_cache": False}
    if impl == FLASH:
        extra = {} if len(rows) == 1 else _varlen(rows)
        return {"position_ids": _restart(rows), "attention_mask": torch.ones(len(rows), 32, dtype=torch.long), **extra}
    return {"attention_mask": _additive(rows), "position_ids": torch.arange(32).expand(len(rows), 32), "use_cache": False}


CORRECT = {"reference": sol.forward_kwargs_for, "collator_everywhere": _collator_everywhere,
           "masks_and_boundaries": _masks_and_boundaries, "mixed": _mixed}


def test_every_backend_gets_two_or_more_different_correct_answers():
    for impl in {impl for impl, _ in bc.KWARGS_CASES}:
        rows = next(r for i, r in bc.KWARGS_CASES if i == impl and len(r) > 1)
        forms = {tuple(sorted((k, str(v.dtype) if isinstance(v, torch.Tensor) else v) for k, v in
                              answer([list(r) for r in rows], impl).items())) for answer in CORRECT.values()}
        assert len(forms) >= 2, impl


@pytest.mark.parametrize("name", list(CORRECT))
def test_forward_kwargs_correct_answers_pass(name):
    truth = _truth_by_case(CORRECT[name])
    assert max(truth.values()) <= 1e-5, truth  # isolated on every case, by the test's own runs
    fb = check_forward_kwargs_for(CORRECT[name])
    assert fb.passed, fb
    assert fb.message.count("e-0") >= len(bc.KWARGS_CASES), fb  # each case's number is shown


def test_forward_kwargs_notes_fields_a_backend_never_reads():
    fb = check_forward_kwargs_for(_collator_everywhere)
    assert fb.passed and "also went to sdpa, eager, flex_attention, which never read them" in fb.message, fb
    assert "also went to" not in check_forward_kwargs_for(sol.forward_kwargs_for).message


def _without(key):
    return lambda rows, impl: {k: v for k, v in sol.forward_kwargs_for(rows, impl).items() if k != key}


def _with(**extra):
    return lambda rows, impl: {**sol.forward_kwargs_for(rows, impl), **{k: f(rows, impl) for k, f in extra.items()}}


def _flash_only(**extra):  # change the reference only on two flash rows
    return lambda rows, impl: {**sol.forward_kwargs_for(rows, impl),
                               **({k: f(rows) for k, f in extra.items()} if impl == FLASH and len(rows) > 1 else {})}


def _not_flash(answer):  # an answer off the flash path, the reference on it
    return lambda rows, impl: sol.forward_kwargs_for(rows, impl) if impl == FLASH else answer(rows, impl)


WRONG = {  # answer, words the verdict must hold, the first case that leaks (by the check's order)
    "cache_left_on": (_without("use_cache"), "you left use_cache out", ("sdpa", 1)),
    "cache_true": (_with(use_cache=lambda r, i: True), "trap 1", ("sdpa", 1)),
    "ones_mask": (_with(attention_mask=lambda r, i: torch.ones(len(r), 32, dtype=torch.long)), "all-ones 2D attention_mask, trap 2", ("sdpa", 1)),
    "bool_4d": (_not_flash(lambda r, i: {"attention_mask": _block_diagonal(r), "use_cache": False}), "bool 4D mask under eager, trap 3", ("eager", 1)),
    "causal_4d": (_not_flash(lambda r, i: {"attention_mask": torch.where(torch.ones(32, 32, dtype=torch.bool).tril(), 0.0, -1e30).expand(len(r), 1, 32, 32)}), "trap 4", ("sdpa", 1)),
    "positions_only": (lambda r, i: {"position_ids": _restart(r), "use_cache": False}, "positions only, on a 2-row batch", (FLASH, 2)),
    "offsets_per_row": (_flash_only(**{k: (lambda key: lambda r: _varlen(r[:1])[key])(k) for k in bc.VARLEN}), "covers row 0 only", (FLASH, 2)),
    "offsets_int64": (_flash_only(cu_seq_lens_q=lambda r: _varlen(r)["cu_seq_lens_q"].long(), cu_seq_lens_k=lambda r: _varlen(r)["cu_seq_lens_k"].long()), "int32", (FLASH, 2)),
    "no_max_length": (lambda r, i: {k: v for k, v in sol.forward_kwargs_for(r, i).items() if not k.startswith("max_length")}, "all four are given", (FLASH, 2)),
    "max_length_short": (_flash_only(max_length_q=lambda r: 5, max_length_k=lambda r: 5), "max_length_q=5", (FLASH, 2)),
    "offsets_only_everywhere": (lambda r, i: {**_varlen(r), "use_cache": False}, "never reads `cu_seq_lens_*`", ("sdpa", 1)),
    "one_row_of_positions": (_with(position_ids=lambda r, i: _restart(r[:1])), "expands it to every row", ("sdpa", 2)),
    "continuous": (_with(position_ids=lambda r, i: torch.arange(32).expand(len(r), 32)), "nothing restarts", ("sdpa", 1)),
    "4d_on_flash": (lambda r, i: {"attention_mask": _additive(r), "use_cache": False}, "a 4D mask on the flash path", (FLASH, 1)),
    "offsets_restart_per_row": (_flash_only(**{k: (lambda key: lambda r: _restarting_offsets(r) if key.startswith("cu") else max(map(max, r)))(k) for k in bc.VARLEN}), "starts again in every row", (FLASH, 2)),
    "padding_mask_on_flash": (lambda r, i: {**sol.forward_kwargs_for(r, i), **({"attention_mask": _padding_mask(r)} if i == FLASH else {})}, "zeros in a 2D attention_mask mark padding", (FLASH, 1)),
    "padding_mask_on_sdpa": (_with(attention_mask=lambda r, i: _padding_mask(r)), "a 2D attention_mask.", ("sdpa", 1)),
    "row_0_4d_mask": (_not_flash(lambda r, i: {"attention_mask": _block_diagonal(r[:1]), "use_cache": False}), "the batch needs (2, 1, 32, 32)", ("sdpa", 2)),
    # a learner's answer (issue 40): the rows flattened into one, as DataCollatorWithFlattening does, input_ids kept (2, 32)
    "flattened_rows": (lambda r, i: {"position_ids": _restart([[n for row in r for n in row]]), "use_cache": False,
                                     **(_varlen(r) if i == FLASH else {})}, "the rows are not yours to reshape", ("sdpa", 2)),
    "flattened_on_flash": (_flash_only(position_ids=lambda r: _restart([[n for row in r for n in row]])), "the rows are not yours to reshape", (FLASH, 2)),
}


def _restarting_offsets(rows):  # cu_seq_lens that start again at 0 in every row: not the flattened batch's
    cu = [0]
    for row in rows:
        total = 0
        for n in row:
            total += n
            cu.append(total)
    return torch.tensor(cu, dtype=torch.int32)


def _padding_mask(rows):  # (B, 32): a 2D mask whose last two tokens are padding
    mask = torch.ones(len(rows), 32, dtype=torch.long)
    mask[:, -2:] = 0
    return mask


@pytest.mark.parametrize(("name"), list(WRONG))
def test_forward_kwargs_wrong_answers_name_their_trap(name):
    answer, named, (impl, B) = WRONG[name]
    truth = _truth_by_case(answer)
    first = next(case for case in bc.KWARGS_CASES if truth[case] > 1e-5)  # the test's own runs
    assert (first[0], len(first[1])) == (impl, B), (first, truth)
    fb = check_forward_kwargs_for(answer)
    assert not fb.passed and fb.attempted, fb
    assert named in fb.message, fb
    assert fb.message.startswith(bc.where(*first)), fb  # the case it names is the first that leaks


@pytest.mark.parametrize(("answer", "named"), [
    (lambda r, i: [("position_ids", _restart(r))], "return a dict"),
    (lambda r, i: {"input_ids": torch.zeros(len(r), 32, dtype=torch.long), **sol.forward_kwargs_for(r, i)}, "input_ids"),
    (lambda r, i: {"position_id": _restart(r), "use_cache": False}, "no attention backend reads ['position_id']"),
    (lambda r, i: {**sol.forward_kwargs_for(r, i), "past_key_values": object()}, "you passed a past_key_values"),
], ids=["not_a_dict", "input_ids", "typo", "cache_object"])
def test_forward_kwargs_malformed_answers_are_named_before_running(answer, named):
    fb = check_forward_kwargs_for(answer)
    assert not fb.passed and fb.attempted and named in fb.message, fb


def _reads_a_cache_named(name: str) -> bool:
    """Measured on the test's own Llama: does its forward fill a DynamicCache handed as ``name``?"""
    from transformers import DynamicCache

    model = _truth_model("sdpa")
    given = DynamicCache(config=model.config)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers 5.24 on: past_key_values is deprecated
        model(input_ids=torch.arange(3, 11)[None], use_cache=True, **{name: given})
    return given.get_seq_length() == 8


@pytest.mark.parametrize("name", ["cache", "past_key_values"])
def test_a_cache_is_named_under_the_installed_keyword(name):
    """past_key_values is read on every version of the window; ``cache`` from transformers 5.24 only
    (LlamaForCausalLM.forward's parameter; up to 5.18 it falls into **kwargs, read by nothing)."""
    from packsim.core.upstream.outputs import per_version

    read = _reads_a_cache_named(name)
    want = True if name == "past_key_values" else per_version(new=True, old=False)
    assert want in (None, read), f"{name} read: {read}"
    assert (name in bc.ALLOWED) == read
    fb = check_forward_kwargs_for(lambda r, i: {**sol.forward_kwargs_for(r, i), name: object()})
    assert not fb.passed and fb.attempted, fb
    named = f"you passed a {name}: a cache" if read else f"no attention backend reads ['{name}']"
    assert named in fb.message, fb


def test_a_misspelt_field_really_changes_nothing():
    """What the typo message says, measured: the model takes the unknown name silently."""
    rows = bc.KWARGS_CASES[0][1]
    typo = _truth({"position_id": _restart(rows), "use_cache": False}, "sdpa", rows)
    none = _truth({"use_cache": False}, "sdpa", rows)
    assert typo == none > 1e-2


def test_flattened_rows_get_a_one_line_hint_with_the_shape_to_give():
    """The learner's answer of issue 40: position_ids flattened to (1, 64) with input_ids (2, 32); the forward
    raises a tensor-size RuntimeError, and the check says the rows stay as given."""
    answer = WRONG["flattened_rows"][0]
    fields = answer([[12, 8, 12], [5, 1, 14, 12]], "sdpa")
    assert tuple(fields["position_ids"].shape) == (1, 64)  # what the learner passed
    fb = check_forward_kwargs_for(answer)
    assert not fb.passed and "RuntimeError" in fb.message and "(1, 64)" in fb.message, fb
    assert "\n" not in fb.hint and fb.hint.startswith("give position_ids (2, 32)"), fb.hint
