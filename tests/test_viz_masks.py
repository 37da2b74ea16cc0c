"""packsim.viz.masks: the mask explorer's pair counts compare the same tokens (issue 40: lesson 03's
explorer set 2080 causal pairs that counted row 2's padding against 196 block-diagonal pairs that did not)."""

from __future__ import annotations

from packsim import PackedBatch, make_examples
from packsim.viz.masks import mask_explorer, mask_figure, pair_counts


def _by_hand(seq: list[int]) -> dict[str, int]:
    """Ground truth by loops: key k <= query q; real = not padding (-1); same example for block-diagonal."""
    T = len(seq)
    pairs = [(q, k) for q in range(T) for k in range(q + 1)]
    return {"causal": len(pairs),
            "causal_real": sum(seq[q] >= 0 and seq[k] >= 0 for q, k in pairs),
            "block_diagonal": sum(seq[q] >= 0 and seq[q] == seq[k] for q, k in pairs)}


def test_pair_counts_by_hand():
    seq = [0, 0, 1, 1, 1, -1, -1]
    assert pair_counts(seq) == _by_hand(seq) == {"causal": 28, "causal_real": 15, "block_diagonal": 9}


def test_lesson_03s_row_2_compares_real_tokens_with_real_tokens():
    batch = PackedBatch.from_examples(make_examples(8, seed=0), 64)  # lesson 03's explorer
    seq = batch.seq_ids[2].tolist()
    want = _by_hand(seq)
    assert want["causal"] == 2080 and want["block_diagonal"] == 196 and want["causal_real"] < want["causal"]
    m = mask_explorer(batch, block_size=16, row=2)
    assert (f"<b>causal</b> {want['causal_real']}, <b>block-diagonal</b> {want['block_diagonal']}" in m.counts.value
            and f"{want['causal']} in all" in m.counts.value)
    title = mask_figure(batch, block_size=16, row=2).layout.annotations[0].text.replace("<br>", " ")  # wrapped
    assert title == (f"causal over the pack {want['causal_real']} pairs of real tokens "
                     f"(+{want['causal'] - want['causal_real']} padding)")
    unpadded = PackedBatch.from_examples(make_examples(1, seed=0), len(make_examples(1, seed=0)[0].tokens))
    assert mask_figure(unpadded, block_size=4).layout.annotations[0].text.replace("<br>", " ").endswith(
        f"{_by_hand(unpadded.seq_ids[0].tolist())['causal']} pairs")  # no padding: one count
