import pytest

from packsim.core.errors import PacksimError
from packsim.core.setups import SETUPS, Setup, get_setup


def test_presets_are_the_documented_switches():
    assert (SETUPS["buggy"].mask, SETUPS["buggy"].positions, SETUPS["buggy"].loss) == ("causal", "continuous", "all")
    assert (SETUPS["correct"].mask, SETUPS["correct"].positions, SETUPS["correct"].loss) == (
        "block_diagonal", "reset", "completion")
    assert SETUPS["padded"].packed is False and SETUPS["padded"].loss == "completion"
    assert not SETUPS["buggy"].isolates_examples and SETUPS["correct"].isolates_examples
    assert SETUPS["padded"].isolates_examples


def test_get_setup_passes_setups_through_and_names_custom_ones():
    custom = Setup("causal", "reset", "completion")
    assert get_setup(custom) is custom
    assert custom.name == "causal+reset+completion"
    assert get_setup("correct") is SETUPS["correct"]


def test_unknown_setup_name_lists_choices():
    with pytest.raises(PacksimError, match="unknown setup 'corect'.*correct"):
        get_setup("corect")


def test_bad_switch_value_says_what_is_allowed():
    with pytest.raises(PacksimError, match=r"Setup.mask='diagonal'.*block_diagonal"):
        Setup(mask="diagonal")


def test_get_setup_parses_combination_strings_like_setup_names():
    s = get_setup("block_diagonal+continuous+completion")
    assert (s.mask, s.positions, s.loss, s.packed) == ("block_diagonal", "continuous", "completion", True)
    assert get_setup(s.name) == s
    assert get_setup("causal+reset+all+padded").packed is False
    with pytest.raises(PacksimError, match="Setup.mask='diag'"):
        get_setup("diag+reset+all")
    with pytest.raises(PacksimError, match="unknown setup 'causal\\+reset'"):
        get_setup("causal+reset")
