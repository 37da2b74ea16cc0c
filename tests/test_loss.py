import pytest
import torch

from packsim.core.errors import PacksimError
from packsim.core.loss import (
    IGNORE_INDEX,
    Role,
    accumulated_loss,
    count_targets,
    make_labels,
    micro_batch_weights,
    packed_cross_entropy,
    response_mask,
    token_losses,
)

ROLES = torch.tensor([[Role.FIRST, Role.PROMPT, Role.RESPONSE, Role.EOS, Role.BOUNDARY, Role.PROMPT,
                       Role.RESPONSE, Role.EOS, Role.PAD, Role.PAD]], dtype=torch.uint8)
IDS = torch.tensor([[1, 5, 6, 2, 1, 7, 8, 2, 0, 0]])


def test_completion_labels_keep_response_and_eos_only():
    labels = make_labels(IDS, ROLES, "completion")
    assert labels.tolist() == [[-100, -100, 6, 2, -100, -100, 8, 2, -100, -100]]


def test_response_mask_is_what_completion_labels_keep():
    keep = response_mask(ROLES)
    assert keep.int().tolist() == [[0, 0, 1, 1, 0, 0, 1, 1, 0, 0]]
    assert torch.equal(keep, make_labels(IDS, ROLES, "completion") != IGNORE_INDEX)


def test_every_role_has_one_label():
    assert [r.label for r in Role] == ["padding", "first", "boundary", "prompt", "response", "EOS", "unknown"]
    assert Role(6) is Role.UNKNOWN


def test_all_labels_count_prompt_padding_and_boundary():
    labels = make_labels(IDS, ROLES, "all")
    assert labels.tolist() == IDS.tolist()
    assert count_targets(labels) == 9  # every token but the first of the row


def test_token_losses_zero_where_ignored():
    torch.manual_seed(0)
    logits = torch.randn(1, 10, 12)
    labels = make_labels(IDS, ROLES, "completion")
    per_tok = token_losses(logits, labels)  # (1, 9): position t predicts labels[t+1]
    counted = labels[:, 1:] != IGNORE_INDEX
    assert (per_tok[~counted] == 0).all() and (per_tok[counted] > 0).all()


def test_per_token_normalisation_across_packs_and_accumulation():
    """Summing micro-batch losses normalised by the step's total targets == one big batch."""
    torch.manual_seed(0)
    logits = torch.randn(2, 10, 12)
    full = torch.tensor([[-100, -100, 3, 4, 5, 6, 7, 8, 9, 10]])  # 8 targets: a full pack
    sparse = torch.tensor([[-100, -100, 3, -100, -100, -100, -100, -100, -100, -100]])  # 1 target
    labels = torch.cat([full, sparse])
    whole = packed_cross_entropy(logits, labels)
    n = count_targets(labels)
    accumulated = packed_cross_entropy(logits[:1], full, num_items=n) + packed_cross_entropy(
        logits[1:], sparse, num_items=n)
    assert torch.allclose(whole, accumulated, atol=1e-6)
    mean_of_means = (packed_cross_entropy(logits[:1], full) + packed_cross_entropy(logits[1:], sparse)) / 2
    assert not torch.allclose(whole, mean_of_means, atol=1e-3), "per-micro-batch means over-weight sparse packs"


def test_bad_loss_inputs_are_explained():
    with pytest.raises(PacksimError, match="unknown loss mode"):
        make_labels(IDS, ROLES, "response")
    with pytest.raises(PacksimError, match="no label is counted"):
        packed_cross_entropy(torch.randn(1, 3, 5), torch.full((1, 3), IGNORE_INDEX))
    with pytest.raises(PacksimError, match="disagree on"):
        packed_cross_entropy(torch.randn(1, 3, 5), torch.zeros(1, 4, dtype=torch.long))


def test_token_mean_and_mean_of_means_over_micro_batches():
    """Ground truth written out by hand: 3 micro-batches with 4, 1 and 0 counted targets."""
    sums, counts = torch.tensor([8.0, 3.0, 0.0]), torch.tensor([4, 1, 0])
    assert float(accumulated_loss(sums, counts)) == pytest.approx((8 + 3) / (4 + 1))
    assert float(accumulated_loss(sums, counts, "mean_of_means")) == pytest.approx((8 / 4 + 3 / 1) / 3)
    w = micro_batch_weights(counts, "mean_of_means")
    assert w.tolist() == pytest.approx([1 / 12, 1 / 3, 0.0])  # the empty one weighs 0, never 0/0
    rows = micro_batch_weights(torch.tensor([[2, 2], [1, 3]]))  # (..., M): a token mean per row
    assert rows.flatten().tolist() == pytest.approx([0.25, 0.25, 0.25, 0.25])
    assert float(accumulated_loss(torch.zeros(2), torch.zeros(2, dtype=torch.long))) == 0.0
    with pytest.raises(PacksimError, match="unknown reduction 'median'"):
        micro_batch_weights(counts, "median")
    with pytest.raises(PacksimError, match="same shape"):
        accumulated_loss(torch.zeros(2), counts)
