"""The checks of notebook 05_completion_only_loss: the reference passes, typical mistakes are named."""

from __future__ import annotations

import torch

from packsim.core.loss import IGNORE_INDEX, Role
from packsim.course.exercises.lesson05_completion_only_loss import (
    CORRECT_LETTER,
    TEMPLATE,
    boundary_cases,
    check_completion_labels,
    check_correct_row,
    check_per_token_loss,
    check_response_start,
    label_batch,
    label_candidates,
    lesson_bpe,
    row_layout,
    show_candidates,
)
from packsim.course.solutions import lesson05_completion_only_loss as sol


def _text(fb) -> str:
    return f"{fb.message} {fb.hint}".lower()


def _labels(first=0, last=0, pad=False, offsets=True):
    """A completion_labels variant: response slice [start + p + first, start + n + last)."""

    def fn(ids, lengths, prompts):
        out = torch.full_like(ids, IGNORE_INDEX)
        start = 0
        for n, p in zip(lengths, prompts, strict=True):
            a, b = start + p + first, start + n + last
            out[a:b] = ids[a:b]
            start += n if offsets else 0
        if pad:
            out[sum(lengths):] = ids[sum(lengths):]
        return out

    return fn


# ----------------------------------------------------------------------------- labels


def test_label_batch_has_every_role():
    roles = set(label_batch().roles.unique().tolist())
    assert roles == {int(r) for r in Role if r != Role.UNKNOWN}  # UNKNOWN: the audit's, never packed


def test_row_layout_covers_the_row():
    batch = label_batch()
    for row in range(batch.input_ids.shape[0]):
        lengths, prompts = row_layout(batch, row)
        assert sum(lengths) == int((batch.seq_ids[row] >= 0).sum())
        assert all(0 < p < n for p, n in zip(prompts, lengths, strict=True))


def test_labels_reference_passes():
    assert check_completion_labels(sol.completion_labels).passed


def test_labels_eos_dropped():
    fb = check_completion_labels(_labels(last=-1))
    assert not fb.passed and "dropped" in _text(fb) and "eos" in _text(fb) and "stop" in _text(fb)


def test_labels_last_prompt_token_kept():
    fb = check_completion_labels(_labels(first=-1))
    assert not fb.passed and "kept" in _text(fb) and "prompt" in _text(fb)


def test_labels_first_response_token_dropped():
    fb = check_completion_labels(_labels(first=1))
    assert not fb.passed and "dropped" in _text(fb) and "response" in _text(fb)


def test_labels_whole_example_kept_names_prompt_and_boundary():
    fb = check_completion_labels(_labels(first=-10**6))
    assert not fb.passed and "prompt" in fb.message and "boundary" in fb.message


def test_labels_padding_kept():
    fb = check_completion_labels(_labels(pad=True))
    assert not fb.passed and "padding" in _text(fb)


def test_labels_no_running_offset():
    fb = check_completion_labels(_labels(offsets=False))
    assert not fb.passed and "position 0" in _text(fb) and "offset" in _text(fb)


def test_labels_first_token_is_free():
    def keep_first(ids, lengths, prompts):
        labels = sol.completion_labels(ids, lengths, prompts)
        labels[0] = ids[0]  # never a target after the shift: harmless
        return labels

    assert check_completion_labels(keep_first).passed


def test_labels_shifted():
    def shifted(ids, lengths, prompts):
        right = sol.completion_labels(ids, lengths, prompts)
        out = torch.full_like(right, IGNORE_INDEX)
        out[:-1] = right[1:]
        return out

    fb = check_completion_labels(shifted)
    assert not fb.passed and "shifted" in _text(fb)


# ----------------------------------------------------------------------------- loss


def test_loss_mean_of_means():
    fb = check_per_token_loss(lambda mbs: torch.stack([t.mean() for t in mbs if t.numel()]).mean())
    assert not fb.passed and "mean of the per-micro-batch means" in _text(fb)


def test_loss_mean_of_means_with_empty_micro_batch_gives_nan():
    def mean_of_means(mbs):
        return torch.stack([t.mean() for t in mbs]).mean()

    # the first case has no empty micro-batch: that one is named as a mean of means
    assert "mean of the" in _text(check_per_token_loss(mean_of_means))

    def nan_only_when_empty(mbs):
        if any(t.numel() == 0 for t in mbs):
            return mean_of_means(mbs)
        return sol.per_token_loss(mbs)

    fb = check_per_token_loss(nan_only_when_empty)
    assert not fb.passed and "nan" in _text(fb)


def test_loss_unnormalised_sum():
    fb = check_per_token_loss(lambda mbs: sum(t.sum() for t in mbs))
    assert not fb.passed and "not normalised" in _text(fb)


def test_loss_divided_by_micro_batches():
    fb = check_per_token_loss(lambda mbs: sum(t.sum() for t in mbs) / len(mbs))
    assert not fb.passed and "number of micro-batches" in _text(fb)


# ----------------------------------------------------------------------------- spot the row


def test_correct_row_reference_passes():
    assert sol.correct_row == CORRECT_LETTER
    assert check_correct_row(sol.correct_row).passed
    assert check_correct_row(" c ").passed


def test_correct_row_wrong_letters_name_the_bug():
    assert "eos" in _text(check_correct_row("A"))
    assert "boundary" in _text(check_correct_row("B"))
    assert "shifted" in _text(check_correct_row("D"))
    assert "not one of" in _text(check_correct_row("E"))


def test_exactly_one_candidate_is_right_and_the_others_are_checked_wrong():
    cand = label_candidates()
    verdicts = {k: check_correct_row(k).passed for k in cand.rows}
    assert verdicts == {k: k == CORRECT_LETTER for k in cand.rows}
    # each wrong row is also caught by the labels check (independent evidence)
    for letter, row in cand.rows.items():
        assert len(set(tuple(r.tolist()) for r in cand.rows.values())) == 4
        assert row.shape == cand.input_ids.shape, letter


def test_show_candidates_prints_a_column_per_token(capsys):
    show_candidates()
    lines = capsys.readouterr().out.splitlines()
    T = label_candidates().input_ids.numel()
    assert len(lines) == 6 and all(len(line.split()) == T + 1 for line in lines)


# ----------------------------------------------------------------------------- the template trap


def _template_search(not_found):
    """The naive answer: the index after the first occurrence of the template's ids tokenized alone."""
    template = lesson_bpe().encode(TEMPLATE).ids

    def fn(full_ids, prompt_ids):
        for i in range(len(full_ids) - len(template) + 1):
            if full_ids[i : i + len(template)] == template:
                return i + len(template)
        return not_found(full_ids, prompt_ids)

    return fn


def test_boundary_cases_cover_clean_and_merged_boundaries():
    cases = boundary_cases()
    assert {c.task for c in cases if c.merged} == {"add", "sort", "reverse", "kv"}
    assert {c.task for c in cases if not c.merged} == {"add", "sort", "reverse"}
    template = lesson_bpe().encode(TEMPLATE).ids
    for c in cases:
        # the offsets' answer is also where the two tokenizations stop agreeing
        assert c.start == sol.response_start(list(c.full_ids), list(c.prompt_ids))
        assert c.merged == (c.start < len(c.prompt_ids))
        assert (template[0] in c.full_ids) != c.merged  # a merge hides the template


def test_response_start_reference_passes():
    assert check_response_start(sol.response_start).passed


def test_response_start_stub_is_not_done_yet():
    def stub(full_ids, prompt_ids):
        raise NotImplementedError

    fb = check_response_start(stub)
    assert not fb.passed and fb.status == "not done yet"


def test_template_search_that_raises_names_the_merge():
    template = lesson_bpe().encode(TEMPLATE).ids
    fb = check_response_start(lambda full, prompt: full.index(template[0]) + 1)
    assert not fb.passed and "ValueError" in fb.message
    assert "'add 7+73='" in fb.message and "'=8'" in fb.message  # the lesson's example
    assert "merged" in fb.message and "finds nothing" in fb.message and "issues/588" in fb.message
    assert "prompt_ids" in fb.hint


def test_template_search_that_returns_minus_one_or_the_end_names_the_merge():
    for not_found in (lambda full, prompt: -1, lambda full, prompt: len(full)):
        fb = check_response_start(_template_search(not_found))
        assert not fb.passed and "no response token would be counted" in fb.message
        assert "merged" in fb.message and "finds nothing" in fb.message


def test_template_search_that_falls_back_to_the_prompt_length():
    fb = check_response_start(_template_search(lambda full, prompt: len(prompt)))
    assert not fb.passed and "len(prompt_ids)" in fb.message and "prefix" in fb.message


def test_prompt_length_names_the_prefix_assumption():
    fb = check_response_start(lambda full, prompt: len(prompt))
    assert not fb.passed and "len(prompt_ids) = 4" in fb.message and "prefix" in fb.message
    assert "'=8'" in fb.message and "never trains" in fb.message


def test_template_token_itself_is_prompt():
    fb = check_response_start(lambda full, prompt: len(prompt) - 1)
    assert not fb.passed and "template token itself" in fb.message


def test_response_start_not_an_int():
    fb = check_response_start(lambda full, prompt: str(len(prompt)))
    assert not fb.passed and "not an int" in fb.message


# ----------------------------------------------------------------------------- other right answers


def test_labels_other_right_answers_pass():
    def vectorised(ids, lengths, prompts):  # token index vs each token's example start and response start
        lengths_t, prompts_t = torch.tensor(lengths), torch.tensor(prompts)
        starts = torch.cumsum(lengths_t, 0) - lengths_t
        t = torch.arange(int(lengths_t.sum()))
        example = torch.repeat_interleave(torch.arange(len(lengths)), lengths_t)
        keep = torch.zeros_like(ids, dtype=torch.bool)
        keep[: len(t)] = t >= starts[example] + prompts_t[example]
        return torch.where(keep, ids, torch.full_like(ids, IGNORE_INDEX))

    def masked_in_place(ids, lengths, prompts):  # start from a copy of the ids, blank what does not count
        labels = ids.clone()
        start = 0
        for n, p in zip(lengths, prompts, strict=True):
            labels[start : start + p] = IGNORE_INDEX
            start += n
        labels[start:] = IGNORE_INDEX
        return labels

    for fn in (vectorised, masked_in_place):
        fb = check_completion_labels(fn)
        assert fb.passed, (fn.__name__, fb)


def test_loss_other_right_answers_pass():
    answers = {
        "one cat, one mean": lambda mbs: torch.cat(mbs).mean(),
        "Python floats": lambda mbs: sum(float(t.sum()) for t in mbs) / sum(len(t) for t in mbs),
        "float32": lambda mbs: torch.cat(mbs).float().sum() / sum(t.numel() for t in mbs),
        "rounded to 4 decimals": lambda mbs: round(float(torch.cat(mbs).mean()), 4),
    }
    for what, fn in answers.items():
        fb = check_per_token_loss(fn)
        assert fb.passed, (what, fb)


def test_correct_row_other_forms_pass():
    for answer in ("C", "c", " C\n"):
        assert check_correct_row(answer).passed, answer


def test_response_start_other_right_answers_pass():
    import numpy as np

    bpe = lesson_bpe()

    def first_difference(full, prompt):  # numpy: the first index where the two disagree
        n = min(len(full), len(prompt))
        differ = np.flatnonzero(np.asarray(full[:n]) != np.asarray(prompt[:n]))
        return differ[0] if len(differ) else np.int64(n)

    def by_characters(full, prompt):  # the offsets rule: the first token whose span ends past the prompt
        prompt_chars = sum(len(bpe.id_to_token(i)) for i in prompt)
        end = 0
        for i, token in enumerate(full):
            end += len(bpe.id_to_token(token))
            if end > prompt_chars:
                return i
        return len(full)

    for fn in (first_difference, by_characters):
        fb = check_response_start(fn)
        assert fb.passed, (fn.__name__, fb)


def test_loss_coarse_rounding_fails():
    fb = check_per_token_loss(lambda mbs: round(float(torch.cat(mbs).mean()), 1))
    assert not fb.passed and "expected" in _text(fb)
