"""The facts design: copies side by side, held-out templates never trained on."""

import pytest

from packsim.core.errors import PacksimError
from packsim.core.packing import pack
from packsim.experiment.paraphrased_facts import ATTRIBUTES, make_facts


@pytest.mark.parametrize("copies", [2, 3])
def test_copies_sit_side_by_side_and_are_flagged(copies):
    fd = make_facts(n_entities=20, n_train=402, seed=0, copies=copies)
    assert len(fd.train) == len(fd.is_repeat) == 402
    for i in range(0, 402 - copies + 1, copies):
        assert all(fd.train[i + j] == fd.train[i] for j in range(copies))
        assert fd.is_repeat[i : i + copies] == [False] + [True] * (copies - 1)
    assert fd.train[0] != fd.train[copies]


def test_course_default_is_three_copies():
    fd = make_facts(n_entities=5, n_train=9, seed=0)
    assert fd.is_repeat == [False, True, True] * 3


def test_test_sets_cover_every_fact_and_heldout_templates_are_never_trained():
    fd = make_facts(n_entities=20, n_train=400, seed=0)
    seen_templates = sum(len(spec[1]) for spec in ATTRIBUTES.values())
    assert len(fd.test_seen) == 20 * seen_templates and len(fd.test_heldout) == 20 * len(ATTRIBUTES)
    train_prompts = {ex.prompt_text for ex in fd.train}
    assert train_prompts <= {ex.prompt_text for ex in fd.test_seen}
    assert not train_prompts & {ex.prompt_text for ex in fd.test_heldout}
    for ex in fd.test_heldout:
        entity = ex.prompt_text.split()[0]
        assert ex.response_text == fd.facts[entity][ex.task]


def test_sequential_packing_keeps_copies_in_the_same_row():
    fd = make_facts(n_entities=20, n_train=400, seed=1, copies=2)
    packs = pack([len(ex) for ex in fd.train], 256, "sequential")
    row_of = {i: r for r, p in enumerate(packs) for i in p}
    split = sum(row_of[i] != row_of[i + 1] for i in range(0, 400, 2))
    assert split <= len(packs)  # a pair is cut only where a row ends


def test_same_seed_same_data_and_bad_sizes():
    assert make_facts(10, 50, seed=3).train == make_facts(10, 50, seed=3).train
    assert make_facts(10, 50, seed=3).facts != make_facts(10, 50, seed=4).facts
    with pytest.raises(PacksimError, match="n_entities, n_train and copies >= 1"):
        make_facts(0, 10)
