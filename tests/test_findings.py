"""The static configuration findings, on hand-built batches (no forward, no GPU needed)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from packsim.auditing.findings import (
    BatchView,
    attention_mask,
    flash_rows,
    padding_free_attention,
)
from packsim.core.boundaries import find_boundaries

POS = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2], [0, 1, 0, 1, 2, 3, 0, 1]])  # (2, 8): 3 examples per row


def view(**fields) -> BatchView:
    fields = {"input_ids": torch.ones(POS.shape, dtype=torch.long), **fields}
    seq = find_boundaries(fields, missing="rows").seq_ids
    return BatchView(fields, seq, seq, "test", False)


def test_flash_rows_follows_is_packed_sequence():
    cu = torch.tensor([0, 3, 5, 8, 10, 14, 16], dtype=torch.int32)
    two_rows = view(position_ids=POS)
    assert flash_rows(two_rows, "flash_attention_2").status == "fail"  # batch_size != 1, no cu_seq_lens
    assert "_is_packed_sequence" in flash_rows(two_rows, "flash_attention_2").evidence
    given = view(position_ids=POS, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=4, max_length_k=4)
    assert flash_rows(given, "flash_attention_2").status == "pass"
    one_row = BatchView({"input_ids": torch.ones(1, 16, dtype=torch.long), "position_ids": POS.reshape(1, -1)},
                        *(2 * [find_boundaries({"position_ids": POS.reshape(1, -1)}, (1, 16)).seq_ids]), "t", False)
    assert flash_rows(one_row, "kernels-community/flash-attn2").status == "pass"
    assert flash_rows(two_rows, "sdpa").status == "pass"  # not a flash path


def test_attention_mask_next_to_restarting_positions():
    ones = torch.ones(POS.shape, dtype=torch.long)
    assert attention_mask(view(position_ids=POS, attention_mask=ones), "sdpa").status == "fail"
    assert attention_mask(view(position_ids=POS, attention_mask=ones), "flash_attention_2").status == "pass"
    holes = ones.clone()
    holes[1, -1] = 0
    assert attention_mask(view(position_ids=POS, attention_mask=holes), "flash_attention_2").status == "fail"
    assert attention_mask(view(position_ids=POS), "sdpa").status == "pass"


def test_padding_free_attention_by_implementation():
    packed = view(position_ids=POS)
    assert padding_free_attention(packed, "sdpa").status == "pass"  # masking_utils.find_packed_sequence_indices
    assert padding_free_attention(packed, "my_custom_kernel").status == "skipped"
    assert padding_free_attention(packed, "flash_attention_2").status == "fail"  # two rows, no cu_seq_lens
    plain = view()  # one example per row: not padding-free
    assert padding_free_attention(plain, "eager").status == "pass"


def test_rows_start_mid_example_only_where_a_bos_really_starts_examples():
    """wrapped_packing says rows start in the middle of an example only when the tokens located the
    examples and the BOS marks starts in this batch; a BOS id the tokenizer never puts in front says nothing."""
    from packsim.auditing.findings import rows_mid_example, wrapped_packing

    BOS, EOS = 1, 2
    ids = torch.tensor([[BOS, 5, 6, EOS, BOS, 7, 8, EOS],   # starts with BOS: whole examples
                        [9, 9, EOS, BOS, 5, 5, 6, EOS]])    # starts with the rest of a cut example
    seq = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1], [2, 2, 2, 3, 3, 3, 3, 3]])
    trainer = SimpleNamespace(processing_class=SimpleNamespace(bos_token_id=BOS, eos_token_id=EOS),
                              model=SimpleNamespace(config=SimpleNamespace()), args=SimpleNamespace())
    tokens = BatchView({"input_ids": ids}, seq, seq, "the tokens", True)
    # ground truth: row 1's first token is not a BOS, while 3 examples of the batch start with one
    assert rows_mid_example(trainer, tokens) == (", 1 of 2 row(s) start in the middle of an example (their "
                                                 "first token is not a BOS, while 3 example(s) in the batch "
                                                 "start with one)")
    assert "1 of 2 row(s) start in the middle" in wrapped_packing(trainer, tokens).evidence
    no_bos = BatchView({"input_ids": torch.where(ids == BOS, 4, ids)}, seq, seq, "the tokens", True)
    assert rows_mid_example(trainer, no_bos) == ""  # the BOS id is never in front: it says nothing
    located = BatchView({"input_ids": ids}, seq, seq, "the trainer's dataset examples", False)
    assert rows_mid_example(trainer, located) == ""  # examples located whole start their rows
    assert "middle" not in wrapped_packing(trainer, located).evidence


def test_flash_fields_catch_a_stale_max_length_and_offsets_that_disagree_with_the_positions():
    """Ground truth from the examples here: the longest is known; a max_length_q one short of it, or
    cu_seq_lens offsets one token off the position_ids restarts, fail before any forward."""
    from transformers import DataCollatorWithFlattening

    from packsim.auditing.findings import flash_fields

    examples = [[1, 5, 6, 7, 2], [1, 8, 9, 2], [1, 10, 11, 12, 13, 14, 2]]
    longest = max(len(e) for e in examples)
    batch = dict(DataCollatorWithFlattening(return_flash_attn_kwargs=True)([{"input_ids": e} for e in examples]))
    assert int(batch["max_length_q"]) == longest  # the collator's fields are right
    assert flash_fields(batch).status == "pass"
    stale = flash_fields({**batch, "max_length_q": longest - 1})
    assert stale.status == "fail" and f"max_length_q={longest - 1}" in stale.evidence and f"{longest} tokens" in stale.evidence
    cu = batch["cu_seq_lens_k"].clone()
    cu[1] += 1  # one token late: the positions still restart at len(examples[0])
    shifted = flash_fields({**batch, "cu_seq_lens_k": cu})
    assert shifted.status == "fail" and "cu_seq_lens_k" in shifted.evidence and "position_ids" in shifted.evidence
    assert flash_fields({"input_ids": batch["input_ids"]}).status == "pass"


def test_offsets_that_are_the_examples_pass_when_only_the_positions_disagree():
    """With the examples known independently (seq, written here), the offsets that are exactly the
    examples are right: positions that do not restart are the positions probe's to judge. Offsets off
    the examples still fail, and without the evidence a disagreement fails as before."""
    from transformers import DataCollatorWithFlattening

    from packsim.auditing.findings import flash_fields

    examples = [[1, 5, 6, 7, 2], [1, 8, 9, 2], [1, 10, 11, 12, 13, 14, 2]]
    seq = torch.tensor([[k for k, e in enumerate(examples) for _ in e]])  # (1, 16): each token's example
    batch = dict(DataCollatorWithFlattening(return_flash_attn_kwargs=True)([{"input_ids": e} for e in examples]))
    continuous = {**batch, "position_ids": torch.arange(seq.shape[1])[None]}  # (1, 16): never restart
    assert flash_fields(continuous).failed  # no evidence: which of the two is wrong is not known
    right = flash_fields(continuous, seq)
    assert right.status == "pass" and "holds the examples' offsets" in right.evidence
    cu = batch["cu_seq_lens_q"].clone()
    cu[1] += 1  # one token off the examples
    assert flash_fields({**continuous, "cu_seq_lens_q": cu}, seq).failed
    assert flash_fields({**batch, "cu_seq_lens_q": cu}, seq).failed  # the positions right, the offsets not


def test_packsim_audit_reports_flash_fields_that_disagree_with_the_positions():
    """packsim.audit adds flash_fields where the batch carries varlen fields: consistent ones pass; offsets
    one token off the position restarts (computed here) FAIL the audit, whatever the sdpa forward does."""
    import packsim
    from packsim.core.model import build_model

    model = build_model("tiny", seed=0).eval()
    pos = torch.cat([torch.arange(n) for n in (5, 7, 4)])[None]  # (1, 16)
    cu = torch.tensor([0, 5, 12, 16], dtype=torch.int32)
    batch = {"input_ids": torch.randint(5, 40, (1, 16), generator=torch.Generator().manual_seed(0)),
             "position_ids": pos, "cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": 7, "max_length_k": 7}
    good = packsim.audit(model, batch, trust_boundaries=True)
    assert next(f for f in good.findings if f.name == "flash_fields").status == "pass"
    restarts = [0, *((pos[0, 1:] <= pos[0, :-1]).nonzero()[:, 0] + 1).tolist(), 16]  # ground truth
    off = cu.clone()
    off[1] += 1
    assert restarts == cu.tolist() != off.tolist()
    bad = packsim.audit(model, {**batch, "cu_seq_lens_q": off, "cu_seq_lens_k": off}, trust_boundaries=True)
    assert "flash_fields" in bad.failed and not bad.ok
