"""packsim.core.text_table: columns as wide as their widest cell, right alignment, Markdown padded or not."""

import pytest

from packsim.core.errors import PacksimError
from packsim.core.text_table import column_widths, markdown_table, text_table

ROWS = [("name", "n", "note"), ("ab", 123, None), ("longer name", 4, "x")]


def test_column_widths_are_the_longest_str_of_each_column():
    assert column_widths(ROWS) == [11, 3, 4]  # "longer name", "123", "note" / "None"
    assert column_widths([]) == []


def test_text_table_pads_every_cell_and_joins_with_two_spaces():
    assert text_table(ROWS) == [
        "name         n    note",
        "ab           123  None",
        "longer name  4    x   ",
    ]


def test_text_table_right_columns_and_an_unpadded_last_cell():
    assert text_table(ROWS, right={1}, pad_last=False) == [
        "name           n  note",
        "ab           123  None",
        "longer name    4  x",
    ]
    assert text_table([("a", "b"), ("ccc", "d")], sep=" | ") == ["a   | b", "ccc | d"]


def test_markdown_table_padded_and_plain():
    assert markdown_table(["a", "bb"], [[1, "xyz"], ["long", ""]]) == (
        "| a    | bb  |\n"
        "|------|-----|\n"
        "| 1    | xyz |\n"
        "| long |     |"
    )
    assert markdown_table(["a", "bb"], [[1, "xyz"]], pad=False) == "| a | bb |\n|---|---|\n| 1 | xyz |"
    assert markdown_table(["only"], []) == "| only |\n|------|"


def test_a_row_of_the_wrong_length_is_refused():
    with pytest.raises(PacksimError, match="has 1 cells but the header has 2"):
        markdown_table(["a", "b"], [[1]])
    with pytest.raises(PacksimError, match="has 3 cells but the first row has 2"):
        text_table([("a", "b"), (1, 2, 3)])
