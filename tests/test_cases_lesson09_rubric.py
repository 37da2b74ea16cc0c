"""packsim.course.cases.lesson09_rubric: an answer read against a rubric, sentence by sentence, no verdict."""

from __future__ import annotations

import pytest

from packsim.course.cases.lesson09_rubric import (
    Found,
    Ingredient,
    RedFlag,
    Rubric,
    SelfCheck,
    read,
    sentences,
)

RUBRIC = Rubric(
    required=(Ingredient("tiles", "it works in tiles", (r"\btiles?\b", r"softmax")),
              Ingredient("offsets", "it takes offsets", (r"offsets",)),
              Ingredient("skips", "it skips tiles", (r"skip\w*",))),
    flags=(RedFlag("zeroing", r"by zero", "nothing is computed there"),
           RedFlag("ids isolate", r"ids isolate", "ids restrict nothing", unless=r"into offsets")),
    optional=(Ingredient("backward", "the backward", (r"backward",)),),
)


def test_sentences_split_at_ends_bullets_semicolons_and_closing_marks():
    assert sentences("One. Two; three: four\n- five\n\nsix\n1. seven\n2) eight") == [
        "One.", "Two;", "three:", "four", "five", "six", "seven", "eight"]
    assert sentences("**Bold.** Next\nsame sentence.") == ["**Bold.", "Next same sentence."]  # a line break is no end


def test_an_ingredient_needs_every_pattern_and_keeps_what_and_where():
    r = read("It works in tiles. A softmax runs online; it takes offsets and skips.", RUBRIC)
    assert not r.missing and r.found["tiles"] == [Found("tiles", "It works in tiles."),
                                                  Found("softmax", "A softmax runs online;")]
    r = read("It works in tiles and takes offsets, and skips.", RUBRIC)  # no softmax: "tiles" is not found
    assert [i.name for i in r.missing] == ["tiles"]


def test_a_negation_governing_an_ingredient_is_marked():
    r = read("Tiles with a softmax, offsets. Tiles are not skipped.", RUBRIC)
    assert r.found["skips"] == [Found("skipped", "Tiles are not skipped.", denied=True)]
    r = read("Tiles with a softmax, offsets. It skips tiles, not rows.", RUBRIC)  # the "not" comes after
    assert r.found["skips"][0].denied is False


def test_patterns_span_line_breaks_and_ignore_case():
    assert not read("TILES and a\nSoftmax; OFFSETS, SKIPS", RUBRIC).missing


@pytest.mark.parametrize(("text", "flagged"), [
    ("Scores are multiplied by zero.", True),
    ("Scores are not multiplied by zero.", False),
    ("Nothing is multiplied by zero.", False),
    ("It isn't multiplying by zero.", False),
    ("Without multiplying by zero.", False),
    ("Unlike a kernel that multiplies by zero, it skips.", False),  # a contrast before the claim
    ("A naive kernel would multiply by zero.", False),  # about another path
    # a negation that denies something else does not hide the claim
    ("Scores are multiplied by zero, so no extra memory is needed.", True),
    ("Scores are multiplied by zero instead of masked.", True),
    ("Never mind the cost, scores are multiplied by zero.", True),
    # a negation right after the claim denies it; one after a conjunction or in the next clause does not
    ("The ids isolate nothing.", False),
    ("The ids isolate the examples and never mix them.", True),
    ("The ids isolate the examples, not the mask.", True),
    # the flag's unless, after the claim in its clause, makes it a right statement
    ("The ids isolate the examples into offsets first.", False),
    ("The ids isolate the examples, and offsets come later.", True),
])
def test_a_red_flag_counts_only_where_its_claim_is_asserted(text, flagged):
    r = read("Tiles, softmax, offsets, skips. " + text, RUBRIC)
    assert bool(r.flags) is flagged, r.flags
    if flagged:  # the sentence, for the check to quote
        assert r.flags[0][1] == text


def test_a_list_of_terms_is_named_and_a_sentence_is_not():
    r = read("tiles, softmax, offsets, skips", RUBRIC)
    assert r.term_lists == [("tiles, softmax, offsets, skips", 4, 4)]
    assert not read("It works in tiles with a softmax over the offsets and skips the rest.", RUBRIC).term_lists


def test_optional_ingredients_are_named_present_or_absent():
    r = read("tiles with a softmax, offsets, skips", RUBRIC)
    assert [i.name for i in r.extras_missing] == ["backward"] and not r.extras
    r = read("tiles with a softmax, offsets, skips, and the backward too", RUBRIC)
    assert list(r.extras) == ["backward"] and not r.extras_missing


def test_the_self_check_lays_each_part_beside_the_model_answer_with_no_verdict():
    box = SelfCheck.of("ex", read("It works in tiles with a softmax. Scores are multiplied by zero.", RUBRIC), RUBRIC)
    assert box.rows[0] == ("tiles", "it works in tiles",
                           "'tiles' + 'softmax' in \"It works in tiles with a softmax.\"")
    assert box.rows[1] == ("offsets", "it takes offsets", "no words of it found")
    assert any('Reread "Scores are multiplied by zero."' in n and "nothing is computed there" in n for n in box.notes)
    assert not hasattr(box, "passed") and box.status == "self-check"
    assert str(box).startswith("[ex] self-check: No verdict") and "self-check" in box._repr_html_()
