"""Evaluation runs each example alone; its one-pass exact match equals greedy decoding."""

import pytest
import torch
from toy import VOCAB, toy_examples

from packsim.core.batch import PackedBatch
from packsim.core.errors import PacksimError
from packsim.core.model import build_model
from packsim.experiment.evaluation import (
    evaluate_isolated,
    evaluate_packed,
    example_scores,
    greedy_decode,
)
from packsim.experiment.training import TrainConfig, train


def _copy_examples(n, seed=0):
    """Prompt ``a b c``, response ``a b c``: learnable in a few dozen steps."""
    ex = toy_examples([(3, 3)] * n, seed)
    return [type(e)(e.tokens[:4] + e.tokens[1:4] + (e.tokens[-1],), 4) for e in ex]


@pytest.fixture(scope="module")
def trained():
    """A tiny model trained briefly on copying: it gets some examples right, not all."""
    data = _copy_examples(16 * 60, seed=1)
    cfg = TrainConfig(steps=60, examples_per_step=16, capacity=64, lr=4e-3, warmup_steps=5, eval_every=0)
    model = build_model("tiny", vocab_size=VOCAB, seed=0)
    train(model, data, "correct", cfg, progress=False)
    return model


def _alone(model, ex):
    """Score one example in a batch of its own: the definition of 'run alone'."""
    batch = PackedBatch.from_examples([ex], len(ex.tokens), setup="padded")
    loss, ok = example_scores(model, batch)
    return float(loss[0]), bool(ok[0])


def test_isolated_scores_equal_each_example_run_by_itself(trained):
    test = _copy_examples(24, seed=7)
    got = evaluate_isolated(trained, test, batch_size=5)
    alone = [_alone(trained, ex) for ex in test]
    assert got["response_loss"] == pytest.approx(sum(a[0] for a in alone) / len(alone), abs=1e-5)
    assert got["exact_match"] == pytest.approx(sum(a[1] for a in alone) / len(alone))
    assert got["n"] == 24 and 0 < got["exact_match"] < 1


def test_isolated_differs_from_packed_under_the_causal_mask(trained):
    """A test that would fail if evaluation packed: under 'buggy' packs the scores move."""
    test = _copy_examples(24, seed=7)
    iso = evaluate_isolated(trained, test)
    buggy = evaluate_packed(trained, test, "buggy", capacity=64)
    correct = evaluate_packed(trained, test, "correct", capacity=64)
    assert abs(buggy["response_loss"] - iso["response_loss"]) > 1e-3
    assert correct["response_loss"] == pytest.approx(iso["response_loss"], abs=1e-5)
    assert correct["exact_match"] == iso["exact_match"]


def test_one_pass_exact_match_equals_greedy_decoding(trained):
    test = _copy_examples(24, seed=9)
    batch = PackedBatch.from_examples(test, 8, setup="padded")
    _, exact = example_scores(trained, batch)
    untrained = build_model("tiny", vocab_size=VOCAB, seed=5)
    _, exact_untrained = example_scores(untrained, batch)
    for model, flags in ((trained, exact), (untrained, exact_untrained)):
        for ex, ok in zip(test, flags.tolist(), strict=True):
            response = list(ex.tokens[ex.n_prompt : -1])
            assert (greedy_decode(model, ex) == response) == ok
    assert exact.any() and not exact.all()


def test_exact_match_by_task_and_empty_input():
    from packsim.core.data import make_examples

    model = build_model("tiny", seed=0)
    out = evaluate_isolated(model, make_examples(12, seed=0))
    assert set(out["exact_match_by_task"]) <= {"reverse", "add", "sort", "kv"}
    with pytest.raises(PacksimError, match="no examples to evaluate"):
        evaluate_isolated(model, [])


def test_evaluation_leaves_the_model_in_eval_mode_and_untouched(trained):
    before = {k: v.clone() for k, v in trained.state_dict().items()}
    evaluate_isolated(trained, _copy_examples(4))
    assert not trained.training
    assert all(torch.equal(before[k], v) for k, v in trained.state_dict().items())


def test_held_out_metrics_uses_the_result_format_keys(trained):
    from packsim.experiment.evaluation import held_out_metrics
    from packsim.experiment.results import EVAL_KEYS

    test = _copy_examples(12, seed=3)
    out = held_out_metrics(trained, test, "buggy", capacity=64)
    assert set(out) == set(EVAL_KEYS) - {"step"}
    assert out["isolated_exact_match"] == evaluate_isolated(trained, test)["exact_match"]
    assert set(held_out_metrics(trained, test)) == {"isolated_exact_match", "isolated_response_loss"}
