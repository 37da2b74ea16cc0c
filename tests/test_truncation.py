"""packsim.auditing.truncation: records past max_length and examples that count no label, on batches built here."""

from __future__ import annotations

import torch

from packsim.auditing.truncation import examples_without_loss, truncated_records


def test_truncated_records_counts_cut_and_prompt_only_records():
    lengths = [(3, 10), (12, 20), (4, 8), (16, 30)]  # (prompt, prompt + completion + EOS)
    found = truncated_records(lengths, max_length=12)
    assert found.status == "fail"
    assert "2 of 4 records are longer than max_length=12 tokens (records 2, 4; longest 30)" in found.evidence
    assert "2 of them lose the whole response" in found.evidence  # prompts of 12 and 16 fill 12
    assert "at least 30" in found.fix
    assert truncated_records(lengths, max_length=30).status == "pass"
    assert truncated_records(lengths, max_length=None).status == "pass"


def test_an_example_without_a_counted_label_fails():
    seq = torch.tensor([[0, 0, 0, 1, 1, 1, 2, 2, -1]])  # three examples, one pad
    labels = torch.tensor([[-100, -100, 5, -100, -100, -100, -100, 7, -100]])  # example 1: prompt only
    found = examples_without_loss(labels, seq)
    assert found.status == "fail" and "1 of 3 examples" in found.evidence and "(examples 1)" in found.evidence
    # the label on example 1's first token is predicted from example 0: it does not count for example 1
    labels[0, 3] = 9
    assert examples_without_loss(labels, seq).status == "fail"
    labels[0, 4] = 9
    assert examples_without_loss(labels, seq).status == "pass"
    assert examples_without_loss(labels, seq, cut_across_rows=True).status == "skipped"
    assert examples_without_loss(None, seq).status == "skipped"


def test_a_collator_dropping_the_eos_is_told_from_truncation():
    """Two examples given whole, the collator keeps all but their EOS: not a truncation (they fit);
    an example longer than max_length and cut at it is one."""
    from packsim.auditing.truncation import _collator_part, collator_cuts

    EOS = 2
    given = [[1, 5, 6, EOS], [1, 7, 8, 9, EOS]]
    row = torch.tensor([[1, 5, 6, 1, 7, 8, 9]])  # ground truth: each lost its last token, the EOS
    found = collator_cuts(given, row, None, None, {EOS})
    assert found["cut"] == {0: (3, 4), 1: (4, 5)} and found["lost_eos"] == [0, 1] and found["longest"] == 5
    text, status, causes = _collator_part(found, None)
    assert status == "fail" and causes == {"collator"}, text
    assert "2 of them lose only their last token, the EOS, while they fit the rows" in text
    text, _, causes = _collator_part(found, 48)
    assert causes == {"collator"} and "while they fit max_length=48 (the longest example given is 5 tokens)" in text
    long = [[1, 5, 6, 7, 8, 9, EOS], [1, 4, EOS]]
    cut = collator_cuts(long, torch.tensor([[1, 5, 6, 7, 1, 4, EOS]]), None, None, {EOS})
    assert cut["cut"] == {0: (4, 7)}
    assert _collator_part(cut, 4)[2] == {"truncation"}  # 7 tokens > max_length=4: truncation explains it
