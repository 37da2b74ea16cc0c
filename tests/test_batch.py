"""PackedBatch: layout invariants (property-based), setups, the collator format, bad input."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from toy import VOCAB, ToyExample, toy_examples
from transformers import DataCollatorWithFlattening

from packsim.core.batch import PackedBatch
from packsim.core.errors import PacksimError
from packsim.core.loss import IGNORE_INDEX, Role
from packsim.core.packing import pack_pieces
from packsim.core.segments import seq_ids_from_cu_seqlens

SHAPES = st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12)), min_size=1, max_size=12)


def _batch_from(shapes, seed, capacity, setup, strategy, overflow="split"):
    return toy_examples(shapes, seed), PackedBatch.from_examples(
        toy_examples(shapes, seed), capacity, setup, strategy=strategy, overflow=overflow)


def _check_invariants(examples, b: PackedBatch, strategy: str, overflow: str = "split"):
    B, T = b.shape
    seen = {i: [] for i in range(len(examples))}
    # which tokens of its example each segment holds: the packer's pieces, in the layout's order
    pieces = [p for row in pack_pieces([len(e.tokens) for e in examples], b.capacity, strategy, overflow)
              for p in row]
    if not b.setup.packed:
        pieces.sort(key=lambda p: (p.index, p.start))
    assert len(pieces) == len(b.segments)
    for s, p in zip(b.segments, pieces, strict=True):
        ids = b.input_ids[s.row, s.start:s.stop].tolist()
        pos = b.example_positions[s.row, s.start:s.stop].tolist()
        assert s.example == p.index and ids == list(examples[s.example].tokens[p.start:p.stop]), "tokens land in order"
        assert pos == list(range(len(pos))), "positions count from 0 in every piece"
        assert (b.seq_ids[s.row, s.start:s.stop] == s.example).all()
        seen[s.example].append((p.start, p.stop))
    for i, ex in enumerate(examples):  # every token once (overflow="split" loses none)
        assert sorted(seen[i])[0][0] == 0 and sum(b - a for a, b in seen[i]) == len(ex.tokens)
    assert int(b.real_mask.sum()) == sum(len(e.tokens) for e in examples)
    assert (b.input_ids[~b.real_mask] == 0).all() and (b.roles[~b.real_mask] == Role.PAD).all()
    # cu_seqlens: int32, one entry per segment over the real tokens, agrees with seq ids
    assert b.cu_seqlens.dtype == torch.int32 and int(b.cu_seqlens[-1]) == b.n_real_tokens
    lens = (b.cu_seqlens[1:] - b.cu_seqlens[:-1]).tolist()
    assert lens == [s.stop - s.start for s in b.segments] and b.max_seqlen == max(lens)
    assert b.row_lengths() == [[s.stop - s.start for s in b.segments if s.row == r] for r in range(B)]
    flat_ids = b.seq_ids.reshape(-1)[b.real_mask.reshape(-1)]
    seg_of_token = seq_ids_from_cu_seqlens(b.cu_seqlens)
    assert (flat_ids == torch.tensor([b.segments[k].example for k in seg_of_token.tolist()])).all()
    # attention segments cover all B*T tokens; block-diagonal ones never mix two examples
    cu, max_len = b.attention_segments()
    assert cu.dtype == torch.int32 and int(cu[0]) == 0 and int(cu[-1]) == B * T
    flat_seq = b.seq_ids.reshape(-1)
    for a, z in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        assert z > a and z - a <= max_len and a // T == (z - 1) // T, "segments stay inside a row"
        if b.setup.mask == "block_diagonal":
            assert len(set(flat_seq[a:z].tolist())) == 1
    # positions follow the setup
    if b.setup.positions == "reset":
        assert torch.equal(b.position_ids, b.example_positions)
    else:
        assert torch.equal(b.position_ids, torch.arange(T).expand(B, T))


@settings(max_examples=300, deadline=None)
@given(shapes=SHAPES, seed=st.integers(0, 10**6), capacity=st.integers(2, 40),
       strategy=st.sampled_from(["wrapped", "ffd", "bfd"]),
       setup=st.sampled_from(["buggy", "correct", "mask_fix", "loss_fix", "positions_only", "padded"]))
def test_packed_batch_invariants(shapes, seed, capacity, strategy, setup):
    examples, b = _batch_from(shapes, seed, capacity, setup, strategy)
    _check_invariants(examples, b, strategy)


@settings(max_examples=200, deadline=None)
@given(shapes=SHAPES, seed=st.integers(0, 10**6), capacity=st.integers(2, 40),
       strategy=st.sampled_from(["wrapped", "ffd", "bfd"]))
def test_labels_follow_the_loss_mode(shapes, seed, capacity, strategy):
    _, b = _batch_from(shapes, seed, capacity, "correct", strategy)
    counted = b.labels != IGNORE_INDEX
    assert torch.equal(counted, b.response_mask), "completion loss counts exactly response + EOS"
    assert not (counted & (b.roles == Role.BOUNDARY)).any()
    everything = b.with_setup("buggy")
    assert torch.equal(everything.labels, b.input_ids), "the 'all' loss counts every token"
    assert torch.equal(everything.input_ids, b.input_ids) and everything.segments == b.segments


def test_roles_mark_first_boundary_prompt_response_eos(examples):
    b = PackedBatch.from_examples(examples[:2], capacity=32, setup="correct")
    first, second = b.segments
    assert (first.row, second.row, first.start, second.start) == (0, 0, 0, first.stop)
    roles = b.roles[0].tolist()
    assert roles[0] == Role.FIRST and roles[second.start] == Role.BOUNDARY
    ex = examples[first.example]
    assert roles[first.start + 1:first.start + ex.n_prompt] == [Role.PROMPT] * (ex.n_prompt - 1)
    assert roles[first.stop - 1] == Role.EOS and roles[first.stop - 2] == Role.RESPONSE
    assert roles[second.stop:] == [Role.PAD] * (32 - second.stop)


def test_padded_setup_puts_one_example_per_row(examples):
    b = PackedBatch.from_examples(examples, capacity=64, setup="padded")
    assert b.shape == (5, max(len(e.tokens) for e in examples))
    assert [s.row for s in b.segments] == [0, 1, 2, 3, 4] and all(s.start == 0 for s in b.segments)


def test_stats_report_fill(examples):
    b = PackedBatch.from_examples(examples, capacity=32, setup="correct")
    st_ = b.stats()
    total = sum(len(e.tokens) for e in examples)
    assert st_.total_tokens == total and st_.n_packs == b.shape[0]
    assert st_.fill_ratio == pytest.approx(total / (b.shape[0] * 32))


def _collator_features(b: PackedBatch):
    """The same examples, in the batch's order, as a transformers collator receives them."""
    return [{"input_ids": b.input_ids[s.row, s.start:s.stop].tolist(),
             "labels": b.labels[s.row, s.start:s.stop].tolist()} for s in b.segments]


@pytest.mark.parametrize("setup", ["correct", "buggy"])
@pytest.mark.parametrize("strategy", ["bfd", "wrapped"])
def test_to_flattening_equals_transformers_collator(examples, setup, strategy):
    b = PackedBatch.from_examples(examples, capacity=32, setup=setup, strategy=strategy)
    ours = b.to_flattening()
    theirs = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)(
        _collator_features(b), return_tensors="pt")
    assert set(theirs) <= set(ours)
    for key, value in theirs.items():
        if isinstance(value, torch.Tensor):
            assert value.dtype == ours[key].dtype, key
            assert torch.equal(value.reshape(ours[key].shape), ours[key]), key
        else:
            assert value == ours[key], key


def test_from_flattening_roundtrips(examples):
    b = PackedBatch.from_examples(examples, capacity=32, setup="correct")
    features = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)(
        _collator_features(b), return_tensors="pt")
    back = PackedBatch.from_flattening(features)
    assert back.shape == (1, b.n_real_tokens)
    flat = back.to_flattening()
    for key in ("input_ids", "labels", "position_ids", "cu_seq_lens_q", "seq_idx"):
        assert torch.equal(flat[key].reshape(-1), features[key].reshape(-1)), key
    # boundaries can come from seq_idx or position_ids alone, with the same result
    for only in ("seq_idx", "position_ids"):
        slim = {k: features[k] for k in ("input_ids", "labels", only)}
        assert torch.equal(PackedBatch.from_flattening(slim).cu_seqlens, back.cu_seqlens), only


def test_roles_from_labels_marks_only_flattened_batches(examples):
    b = PackedBatch.from_examples(examples, capacity=32, setup="buggy")
    assert not b.roles_from_labels and not b.with_setup("correct").roles_from_labels
    back = PackedBatch.from_flattening(b.with_setup("correct").to_flattening())
    assert back.roles_from_labels and back.strategy == "given"
    # completion labels do not depend on the setup's loss: what training logs and evaluation score
    assert torch.equal(b.completion_labels, b.with_setup("correct").labels)


def test_with_setup_switches_positions_and_labels(examples):
    b = PackedBatch.from_examples(examples, capacity=32, setup="correct")
    buggy = b.with_setup("buggy")
    assert torch.equal(buggy.position_ids[0], torch.arange(32))
    assert torch.equal(buggy.with_setup("correct").labels, b.labels)


# ---- bad input: a clear message and nothing half-built --------------------------------------------

BAD_CASES = [
    ("no examples", lambda ex: PackedBatch.from_examples([], 32), "no examples"),
    ("empty example", lambda ex: PackedBatch.from_examples([ToyExample((), 0)], 32), "example 0 is empty"),
    ("empty response", lambda ex: PackedBatch.from_examples([ToyExample((1, 5), 2)], 32), "no response tokens"),
    ("zero capacity", lambda ex: PackedBatch.from_examples(ex, 0), "capacity must be a positive int"),
    ("float capacity", lambda ex: PackedBatch.from_examples(ex, 32.0), "capacity must be a positive int"),
    ("too long", lambda ex: PackedBatch.from_examples(ex, 10, overflow="error"), "longer than|exceeds|capacity"),
    ("outside vocab", lambda ex: PackedBatch.from_examples([ToyExample((1, 99, 2), 2)], 32, vocab_size=VOCAB),
     "token id 99 outside the vocabulary"),
    ("unknown setup", lambda ex: PackedBatch.from_examples(ex, 32, setup="fixed"), "unknown setup"),
    ("unknown strategy", lambda ex: PackedBatch.from_examples(ex, 32, strategy="greedy"), "greedy"),
    ("not an example", lambda ex: PackedBatch.from_examples([[1, 2, 3]], 32), "pass packsim.core.data.Example"),
    ("layout switch", lambda ex: PackedBatch.from_examples(ex, 32).with_setup("padded"), "different row"),
    ("no boundaries", lambda ex: PackedBatch.from_flattening({"input_ids": torch.ones(1, 5, dtype=torch.long)}),
     "no example boundaries"),
    ("bad cu_seqlens", lambda ex: PackedBatch.from_flattening(
        {"input_ids": torch.ones(1, 5, dtype=torch.long), "cu_seq_lens_q": torch.tensor([0, 3, 6])}), "int32|end"),
]


@pytest.mark.parametrize("name,call,message", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_input_is_explained(examples, name, call, message):
    with pytest.raises(PacksimError, match=message):
        call(examples)


def test_repr_is_a_one_line_summary(examples):
    b = PackedBatch.from_examples(examples, capacity=32, setup="correct")
    text = repr(b)
    assert text.startswith("PackedBatch(setup='correct', rows=") and "\n" not in text and "tensor" not in text


# --- from_examples against the loop builder it replaced (issue 24) -------------------------------
# The builder before issue 24, verbatim in substance: one Python loop over the pieces of pack_pieces
# (positions since issue 30: 0.. in every piece, not the piece's offset in its example).


def _loop_reference(examples, capacity, setup, strategy, overflow, pad_id=0):
    from packsim.core.packing import pack_pieces
    from packsim.core.segments import Segment

    parts = [(list(e.tokens), e.n_prompt) for e in examples]
    packs = pack_pieces([len(t) for t, _ in parts], capacity, strategy=strategy, overflow=overflow)
    if setup != "padded":
        rows = packs
    else:
        rows = [[p] for p in sorted((p for pk in packs for p in pk), key=lambda p: (p.index, p.start))]
    T = capacity if setup != "padded" else max(p.stop - p.start for row in rows for p in row)
    B = len(rows)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    seq = torch.full((B, T), -1, dtype=torch.long)
    roles = torch.full((B, T), int(Role.PAD), dtype=torch.uint8)
    pos = torch.zeros((B, T), dtype=torch.long)
    segments = []
    for r, row in enumerate(rows):
        t = 0
        for p in row:
            tokens, n_prompt = parts[p.index]
            n = p.stop - p.start
            ids[r, t:t + n] = torch.tensor(tokens[p.start:p.stop])
            seq[r, t:t + n] = p.index
            pos[r, t:t + n] = torch.arange(n)  # the position convention: 0.. in every piece
            got = [Role.PROMPT if j < n_prompt else Role.EOS if j == len(tokens) - 1 else Role.RESPONSE
                   for j in range(p.start, p.stop)]
            got[0] = Role.FIRST if t == 0 else Role.BOUNDARY
            roles[r, t:t + n] = torch.tensor(got, dtype=torch.uint8)
            segments.append(Segment(r, t, t + n, p.index))
            t += n
        pos[r, t:] = torch.arange(T - t)
    return ids, seq, roles, pos, segments


@settings(max_examples=300, deadline=None)
@given(shapes=SHAPES, seed=st.integers(0, 10**6), capacity=st.integers(2, 40),
       strategy=st.sampled_from(["wrapped", "sequential", "ffd", "bfd"]),
       setup=st.sampled_from(["correct", "buggy", "padded"]), overflow=st.sampled_from(["split", "truncate"]))
def test_from_examples_equals_the_loop_builder(shapes, seed, capacity, strategy, setup, overflow):
    examples = toy_examples(shapes, seed)
    b = PackedBatch.from_examples(examples, capacity, setup, strategy=strategy, overflow=overflow, pad_id=3)
    ids, seq, roles, pos, segments = _loop_reference(examples, capacity, setup, strategy, overflow, pad_id=3)
    assert torch.equal(b.input_ids, ids) and torch.equal(b.seq_ids, seq) and torch.equal(b.roles, roles)
    assert torch.equal(b.example_positions, pos)
    assert b.segments == segments and list(b.segments) == segments and len(b.segments) == len(segments)
    assert b.segments[-1] == segments[-1] and b.segments[:2] == segments[:2]
    assert b.cu_seqlens.tolist() == [0, *torch.tensor([s.stop - s.start for s in segments]).cumsum(0).tolist()]


def test_a_token_outside_the_vocabulary_names_its_example(examples):
    bad = [*examples[:2], ToyExample((1, VOCAB + 5, 2), 1)]
    with pytest.raises(PacksimError, match=f"example 2 has token id {VOCAB + 5} outside the vocabulary"):
        PackedBatch.from_examples(bad, 64, vocab_size=VOCAB)


def test_segments_read_like_a_list_of_segments(examples):
    b = PackedBatch.from_examples(examples, 32)
    as_list = list(b.segments)
    assert repr(b.segments) == f"Segments({as_list!r})" and b.segments[-1] == as_list[-1]
    with pytest.raises(IndexError):
        b.segments[len(as_list)]
    assert b.segments != as_list[:-1] and b.segments == tuple(as_list)


# --- from_examples reads tokens held in arrays, and each example's tokens once (issue 33) ---------

_TOKEN_KINDS = ("list", "numpy int64", "numpy int32", "tensor", "pyarrow")


def _tokens_as(kind: str, tokens):
    import numpy as np
    import pyarrow as pa

    if kind.startswith("numpy"):
        return np.asarray(tokens, dtype=kind.split()[1])
    return {"list": list, "tensor": torch.tensor, "pyarrow": pa.array}[kind](tokens)


@settings(max_examples=60, deadline=None)
@given(shapes=SHAPES, seed=st.integers(0, 10**6), capacity=st.integers(2, 40),
       kind=st.sampled_from(_TOKEN_KINDS), strategy=st.sampled_from(["wrapped", "bfd"]))
def test_from_examples_reads_tokens_of_any_array_kind_as_the_tuples(shapes, seed, capacity, kind, strategy):
    examples = toy_examples(shapes, seed)
    want = PackedBatch.from_examples(examples, capacity, strategy=strategy, overflow="split")
    given_kind = [ToyExample(_tokens_as(kind, e.tokens), e.n_prompt) for e in examples]
    got = PackedBatch.from_examples(given_kind, capacity, strategy=strategy, overflow="split")
    for name in ("input_ids", "labels", "position_ids", "seq_ids", "roles", "cu_seqlens"):
        assert torch.equal(getattr(got, name), getattr(want, name)), (kind, name)
    assert got.segments == want.segments and got.lengths == want.lengths
    dicts = [{"prompt_ids": _tokens_as(kind, e.tokens[:e.n_prompt]),
              "response_ids": _tokens_as(kind, e.tokens[e.n_prompt:])} for e in examples]
    assert torch.equal(PackedBatch.from_examples(dicts, capacity, strategy=strategy, overflow="split").input_ids,
                       want.input_ids)


def test_from_examples_reads_each_examples_tokens_once(examples):
    """``Example.tokens`` builds a fresh list on every read: one read per example, not three."""
    reads = []

    class Counted:
        def __init__(self, ex):
            self._ex, self.n_prompt = ex, ex.n_prompt

        @property
        def tokens(self):
            reads.append(1)
            return list(self._ex.tokens)

    b = PackedBatch.from_examples([Counted(e) for e in examples], 32)
    assert len(reads) == len(examples)
    assert torch.equal(b.input_ids, PackedBatch.from_examples(examples, 32).input_ids)
