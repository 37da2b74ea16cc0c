"""packsim.course.exercises.lesson09_rubric: an answer read against a rubric, word by word."""

from __future__ import annotations

import pytest

from packsim.course.exercises.lesson09_rubric import Ingredient, RedFlag, Rubric, read, sentences

RUBRIC = Rubric(
    required=(Ingredient("tiles", "it works in tiles", (r"\btiles?\b", r"softmax")),
              Ingredient("offsets", "it takes offsets", (r"offsets",))),
    flags=(RedFlag("zeroing", r"by zero", "nothing is computed there"),),
    optional=(Ingredient("backward", "the backward", (r"backward",)),),
)


def test_sentences_split_at_ends_bullets_and_semicolons():
    assert sentences("One. Two; three: four\n- five\n\nsix") == ["One.", "Two;", "three:", "four", "five", "six"]


def test_an_ingredient_needs_every_pattern_and_keeps_what_it_matched():
    r = read("It works in tiles with an online softmax and takes offsets.", RUBRIC)
    assert r.passed and r.found == {"tiles": ["tiles", "softmax"], "offsets": ["offsets"]}
    r = read("It works in tiles and takes offsets.", RUBRIC)  # no softmax: "tiles" is not found
    assert not r.passed and [i.name for i in r.missing] == ["tiles"]


def test_patterns_span_line_breaks_and_ignore_case():
    assert read("TILES and a\nSoftmax; OFFSETS", RUBRIC).passed


@pytest.mark.parametrize(("text", "flagged"), [
    ("Tiles, softmax, offsets. Scores are multiplied by zero.", True),
    ("Tiles, softmax, offsets. Scores are not multiplied by zero.", False),
    ("Tiles, softmax, offsets. Nothing is multiplied by zero.", False),
    ("Tiles, softmax, offsets. It isn't multiplying by zero.", False),
    ("Tiles, softmax, offsets; without multiplying by zero.", False),
    # a negation that denies something else does not hide the claim
    ("Tiles, softmax, offsets. Scores are multiplied by zero, so no extra memory is needed.", True),
    ("Tiles, softmax, offsets. Scores are multiplied by zero instead of masked.", True),
    ("Tiles, softmax, offsets. Never mind the cost, scores are multiplied by zero.", True),
])
def test_a_red_flag_counts_unless_a_negation_denies_it(text, flagged):
    r = read(text, RUBRIC)
    assert bool(r.flags) is flagged and r.passed is not flagged
    if flagged:  # the sentence, for the check to quote
        assert r.flags[0][1] == next(x for x in sentences(text) if "by zero" in x)


def test_optional_ingredients_never_decide_the_verdict():
    r = read("tiles, softmax, offsets", RUBRIC)
    assert r.passed and [i.name for i in r.extras_missing] == ["backward"] and not r.extras
    r = read("tiles, softmax, offsets, and the backward too", RUBRIC)
    assert r.passed and r.extras == {"backward": ["backward"]}
