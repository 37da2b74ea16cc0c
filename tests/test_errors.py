"""packsim.core.errors: PacksimError is a ValueError, and raised_outside_packsim tells the user's code
(and a reference kernel) from packsim's own by the innermost frame of the traceback."""

from __future__ import annotations

import pytest

import packsim
from packsim.core.errors import PacksimError, raised_outside_packsim


def _caught(fn, *args):
    try:
        fn(*args)
    except Exception as err:  # noqa: BLE001 - the test inspects whatever was raised
        return err
    raise AssertionError("nothing raised")


def test_packsim_error_is_a_value_error_with_the_fix():
    with pytest.raises(ValueError, match="unknown setup 'nope'"):
        packsim.get_setup("nope")
    assert issubclass(PacksimError, ValueError)


def test_an_exception_of_the_users_code_is_outside_packsim():
    def collator(features):
        return features["prompt_ids"]

    assert raised_outside_packsim(_caught(collator, {})) is True  # KeyError raised in this file


def test_an_exception_raised_in_packsims_code_is_not():
    err = _caught(packsim.get_setup, "nope")  # raised in packsim/core/setups (its innermost frame)
    assert isinstance(err, PacksimError) and raised_outside_packsim(err) is False
    err = _caught(raised_outside_packsim, 1)  # AttributeError in packsim/core/errors.py itself
    assert isinstance(err, AttributeError) and raised_outside_packsim(err) is False


def test_a_reference_kernel_stands_for_a_cuda_package_so_it_counts_as_outside():
    from packsim.reference.conv import upcast

    err = _caught(upcast, "not a tensor")  # AttributeError raised in packsim/reference/conv.py
    assert isinstance(err, AttributeError) and raised_outside_packsim(err) is True


def test_an_exception_never_raised_has_no_frame_and_is_not_outside():
    assert raised_outside_packsim(ValueError("made, not raised")) is False
