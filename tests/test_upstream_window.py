"""packsim.core.upstream.window: the tested window agrees with the files that state it, says when a
version is outside it (one line, the version and the range), and the lock pins what it tested."""

import re
import warnings
from pathlib import Path

import pytest
from packaging.version import Version

from packsim.core.upstream import window
from packsim.core.upstream.window import TESTED, outside, stack_line, warn_outside, window_lines

ROOT = Path(__file__).resolve().parents[1]


def _pins(path: Path) -> dict[str, str]:
    return {m[1].lower(): m[2] for m in re.finditer(r"^([A-Za-z0-9_.-]+)==([^\s;#]+)", path.read_text(), re.M)}


def _floors(path: Path) -> dict[str, str]:
    return {m[1].lower(): m[2] for m in re.finditer(r"^([A-Za-z0-9_.-]+)>=([^\s;#]+)$", path.read_text(), re.M)}


def test_the_window_ends_are_the_constraints_files():
    low, lock = _pins(ROOT / "constraints/axolotl-0.19.txt"), _pins(ROOT / "constraints/lock.txt")
    new = _floors(ROOT / "constraints/window-new.txt")
    assert set(new) == set(TESTED), "constraints/window-new.txt floors exactly the window's packages"
    for package, (lowest, newest) in TESTED.items():
        assert low[package] == lowest, f"{package}: window.py says {lowest}, the Axolotl pins {low[package]}"
        assert new[package] == newest, f"{package}: window.py says {newest}, window-new.txt {new[package]}"
        if package == "torch":  # the lock's torch is the build `make lock` saw (here the CPU build of the low end)
            assert Version(lowest) <= Version(lock[package]) <= Version(newest), f"torch {lock[package]} in the lock"
        else:
            assert lock[package] == newest, f"{package}: window.py says {newest}, the lock {lock[package]}"


def test_torch_versions_with_a_build_label_are_read_by_their_release():
    assert outside("torch", "2.13.0+cpu") == "" and outside("torch", "2.15.0+cu132") == ""
    assert outside("torch", "2.12.1").startswith("torch 2.12.1 is older than packsim's tested window")
    assert outside("torch", "2.16.0+cu132").startswith("torch 2.16.0+cu132 is newer than")


def test_the_lock_pins_every_package_without_local_labels():
    lines = [line for line in (ROOT / "constraints/lock.txt").read_text().splitlines() if line and line[0] != "#"]
    assert lines and all("==" in line and "+" not in line for line in lines)
    assert not any(line.lower().startswith("packsim==") for line in lines)


@pytest.mark.parametrize("version, side", [("5.16.0", "older than"), ("5.26.0", "newer than"),
                                           ("5.26.0.dev0", "newer than"), ("4.57.6", "older than")])
def test_outside_names_the_version_and_the_range(version, side):
    line = outside("transformers", version)
    low, high = TESTED["transformers"]
    assert line.startswith(f"transformers {version} is {side} packsim's tested window ({low} to {high})")
    assert "\n" not in line


@pytest.mark.parametrize("version", ["5.16.1", "5.20.0", "5.25.0"])
def test_inside_is_silent(version):
    assert outside("transformers", version) == ""


def test_not_installed_and_unknown_packages_are_inside(monkeypatch):
    monkeypatch.setattr(window, "installed", lambda package: None)
    assert outside("trl") == ""  # not installed: nothing to warn about
    assert outside("numpy", "0.1") == ""  # not a package of the window
    assert "not a version" in outside("transformers", "banana")


def test_warn_outside_warns_once_per_line(monkeypatch):
    monkeypatch.setattr(window, "installed", lambda p: "5.99.0" if p == "transformers" else None)
    monkeypatch.setattr(window, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert len(warn_outside()) == 1 and len(warn_outside()) == 1
    assert [str(w.message) for w in caught] == [f"packsim: {outside('transformers', '5.99.0')}"]
    rows = {p: (inside, detail) for p, inside, detail in window_lines()}
    assert rows["transformers"][0] is False and "5.99.0 is newer than" in rows["transformers"][1]


def test_stack_line_names_the_installed_versions():
    line = stack_line()
    assert line.startswith("torch ") and f"transformers {window.installed('transformers')}" in line
