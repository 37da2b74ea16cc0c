"""Spot-the-bug quizzes: shipped data, marking and scoring, and clear errors for bad files."""

from __future__ import annotations

import re
import textwrap

import pytest

from packsim.core.errors import PacksimError
from packsim.viz import load_quizzes, quiz, quiz_figure
from packsim.viz.quiz_data import grade, split_words

SCORE = re.compile(r"Score: (\d+)/(\d+)")


def _score(w) -> tuple[int, int]:
    m = SCORE.search(w.result.value)
    assert m, w.result.value
    return int(m.group(1)), int(m.group(2))


def _marked(w) -> list[int]:
    return [i for i, b in enumerate(w.buttons) if "packsim-marked" in b._dom_classes]


def test_shipped_quizzes_are_valid_and_varied():
    quizzes = load_quizzes()
    assert len(quizzes) >= 8
    assert {q.kind for q in quizzes} == {"code", "prose"}
    assert len({q.name for q in quizzes}) == len(quizzes)
    for q in quizzes:
        words = q.words
        for bug in q.bugs:
            assert bug.positions and len(bug.why) > 40
            texts = {words[p].text.strip(".,;:!?\"'") for p in bug.positions}
            assert texts <= {w.strip(".,;:!?\"'") for w in bug.words}


def test_css_contract_and_mark_unmark():
    w = quiz("collator-labels")
    assert "packsim-quiz" in w.widget._dom_classes
    assert "packsim-quiz-submit" in w.submit._dom_classes
    assert "packsim-quiz-result" in w.result._dom_classes
    assert len(w.buttons) == len(w.current.words)
    assert all("packsim-quiz-word" in b._dom_classes for b in w.buttons)
    assert [b.description for b in w.buttons] == [x.text for x in w.current.words]
    w.buttons[3].click()
    w.buttons[5].click()
    assert _marked(w) == [3, 5]
    w.buttons[3].click()  # clicked again: unmarked
    assert _marked(w) == [5]
    for _ in range(21):  # rapid repeated clicks: odd count leaves it marked
        w.buttons[7].click()
    assert _marked(w) == [5, 7]


def test_empty_submission_scores_zero_and_explains_every_bug():
    w = quiz("flash-varlen-call")
    w.submit.click()
    assert _score(w) == (0, 3)
    assert w.result.value.count("missed") == 3
    assert "int32" in w.result.value  # explanations shown
    missed = {p for b in w.current.bugs for p in b.positions}
    assert {i for i, b in enumerate(w.buttons) if "packsim-miss" in b._dom_classes} == missed


def test_full_marks_partial_marks_and_wrong_marks():
    w = quiz("flash-varlen-call")
    bugs = [b.positions[0] for b in w.current.bugs]
    for p in bugs:
        w.buttons[p].click()
    w.submit.click()
    assert _score(w) == (3, 3)
    assert all("packsim-hit" in w.buttons[p]._dom_classes for p in bugs)
    fine = next(i for i, x in enumerate(w.current.words) if x.text == "int64")
    w.buttons[bugs[0]].click()  # unmark one bug, mark a word that is fine
    w.buttons[fine].click()
    w.submit.click()
    assert _score(w) == (1, 3)  # 2 found - 1 wrong
    assert "marked by mistake" in w.result.value and "int32" in w.result.value
    assert "packsim-wrong" in w.buttons[fine]._dom_classes
    assert "packsim-hit" not in w.buttons[bugs[0]]._dom_classes  # result colours refreshed
    assert "packsim-miss" in w.buttons[bugs[0]]._dom_classes


def test_marking_everything_does_not_pay():
    w = quiz("flattening-plus-mask")
    for b in w.buttons:
        b.click()
    w.submit.click()
    assert _score(w) == (0, 1)


def test_any_of_several_words_finds_a_bug_once():
    q = next(q for q in load_quizzes() if q.name == "completion-only-loss")
    drop_eos = q.bugs[0]
    assert grade(q, {drop_eos.positions[1]}).found == (0,)
    g = grade(q, set(drop_eos.positions))  # both words of one bug: found once, nothing wrong
    assert g.found == (0,) and g.wrong == () and g.score == 1


def test_switching_quiz_resets_marks_and_result():
    w = quiz(0)
    w.buttons[0].click()
    w.submit.click()
    w.picker.value = 3
    assert w.current.name == load_quizzes()[3].name
    assert _marked(w) == [] and w.result.value == ""
    assert [b.description for b in w.buttons] == [x.text for x in w.current.words]
    w.clear.click()  # clearing with nothing marked is fine
    w.submit.click()
    assert _score(w)[0] == 0


def test_code_keeps_lines_and_indentation():
    words = split_words("def f(x):\n    return x\n")
    assert [(x.line, x.indent, x.text) for x in words] == [
        (0, 0, "def"),
        (0, 0, "f(x):"),
        (1, 4, "return"),
        (1, 4, "x"),
    ]
    w = quiz("grad-accum-normalisation")
    lines = w.current.passage.rstrip("\n").split("\n")
    assert len(w.words_box.children) == len(lines)


GOOD = """
quizzes:
  - name: mine
    title: My quiz
    kind: prose
    passage: The mask is causal over the pack.
    bugs:
      - word: causal
        why: it should be block-diagonal so examples do not see each other.
"""


def _write(tmp_path, text, name="q.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_instructor_file_loads(tmp_path):
    path = _write(tmp_path, GOOD)
    w = quiz(path=path)
    assert w.current.title == "My quiz" and len(w.buttons) == 7
    w.buttons[3].click()  # "causal"
    w.submit.click()
    assert _score(w) == (1, 1)
    assert quiz("mine", path=tmp_path).current.name == "mine"  # a folder works too


BAD = [
    ("quizzes: [", "not valid YAML"),
    ("- just a list", "'quizzes' list"),
    (GOOD.replace("    title: My quiz\n", ""), "quiz 'mine': field 'title'"),
    (GOOD.replace("kind: prose", "kind: poem"), "quiz 'mine': field 'kind'"),
    (GOOD.replace("word: causal", "word: diagonal"), "quiz 'mine': bugs[0]: word 'diagonal'"),
    (GOOD.replace("word: causal", "word: causal\n        occurrence: 2"), "occurs 1 time(s)"),
    (GOOD.replace("        why: it should", "        because: it should"), "bugs[0]: field 'why'"),
    (GOOD.replace("    bugs:\n", "    bug:\n"), "unknown field(s) ['bug']"),
    (GOOD + "    fine:\n      pack: fine\n      nope: x\n", "fine: word 'nope'"),
    (GOOD.replace("  - name: mine\n    title:", "  - title:"), "quiz #1: field 'name'"),
]


@pytest.mark.parametrize("text, message", BAD)
def test_malformed_files_name_the_quiz_and_field(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(PacksimError) as err:
        load_quizzes(path)
    assert message in str(err.value)
    assert str(path) in str(err.value)


def test_duplicate_names_and_missing_files(tmp_path):
    _write(tmp_path, GOOD, "a.yaml")
    _write(tmp_path, GOOD, "b.yaml")
    with pytest.raises(PacksimError, match="'mine' is used twice"):
        load_quizzes(tmp_path)
    with pytest.raises(PacksimError, match="does not exist"):
        load_quizzes(tmp_path / "missing.yaml")
    with pytest.raises(PacksimError, match="no quiz named 'nope'"):
        quiz("nope")
    with pytest.raises(PacksimError, match="out of range"):
        quiz(99)


def test_static_answer_key():
    fig = quiz_figure("flash-varlen-call")
    passage, key = fig.data
    assert passage.type == "table" and key.type == "table"
    assert list(key.cells.values[0]) == [
        "seq_lens.cumsum(0)",
        "int(seq_lens[0])",
        "causal=False",
    ]
    assert list(key.cells.values[1]) == ["2", "3", "6"]
