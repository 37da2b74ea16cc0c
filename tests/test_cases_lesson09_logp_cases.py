"""packsim.course.cases.lesson09_logp_cases: A8's packed rows are the documented ones and their ground truth is right.

The truth here runs each example alone, one token at a time, through an eager-attention copy of the
weights (``_truth_by_loop``, shared with the check's tests).
"""

from __future__ import annotations

import torch
from test_exercises_lesson09_follow_up_drills import _spans, _truth_by_loop

from packsim.course.cases.lesson09_logp_cases import packed_logp_cases, row_logp
from packsim.course.solutions import lesson09_follow_up_drills as sol


def test_cases_are_the_documented_rows_and_the_oracle_is_right():
    group, docs = packed_logp_cases()
    assert [b - a for a, b in _spans(group.cu_seqlens)] == [11, 9, 13, 10] and group.cu_seqlens.dtype == torch.int32
    assert [b - a for a, b in _spans(docs.cu_seqlens)] == [7, 5, 9] and bool(docs.completion_mask.all())
    prompts = [group.input_ids[a:a + 6] for a, _ in _spans(group.cu_seqlens)]
    assert all(torch.equal(p, prompts[0]) for p in prompts)  # one prompt, four completions
    assert all(not bool(group.completion_mask[a:a + 6].any()) and bool(group.completion_mask[a + 6:b].all())
               for a, b in _spans(group.cu_seqlens))
    for case in (group, docs):
        truth = _truth_by_loop(case)
        assert [len(x) for x in truth] == [len(x) for x in case.alone]
        assert max(float((x - y).abs().max()) for x, y in zip(truth, case.alone, strict=True)) < 2e-6
        ref = sol.packed_token_logps(case.logits, case.input_ids, case.cu_seqlens, case.completion_mask)
        assert max(float((x.double() - y).abs().max()) for x, y in zip(ref, truth, strict=True)) < 5e-6  # packed == alone


def test_row_logp_scores_each_token_with_the_logit_before_it():
    logits = torch.randn(4, 7, generator=torch.Generator().manual_seed(0))  # (T, V)
    ids = torch.tensor([3, 1, 6, 2])
    lp = torch.log_softmax(logits.double(), -1)  # (T, V)
    shifted = row_logp(logits, ids)
    assert torch.isnan(shifted[0]) and torch.equal(shifted[1:], torch.stack([lp[t - 1, ids[t]] for t in range(1, 4)]))
    assert torch.equal(row_logp(logits, ids, shift=False), torch.stack([lp[t, ids[t]] for t in range(4)]))
