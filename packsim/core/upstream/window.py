"""The tested support window: the torch, transformers, TRL and accelerate releases packsim's tests pass on.

The lower ends are the stack the newest Axolotl release pins (constraints/axolotl-0.19.txt, the
CI's window-low leg); the upper ends are the newest releases on the package index when this was
last tested (constraints/window-new.txt, the floors of the window-new leg, which installs whatever
is newest and fails when a release moves something packsim reaches into). constraints/lock.txt,
the main CI run, pins the upper ends too, except torch: there it is the build ``make lock`` was
given, a release of the window (this project's lock: the CPU build of the lower end, which ``make``
takes where pip's newest torch is a multi-GB CUDA build). pyproject.toml states the lower ends as
install bounds and no upper cap, so packsim installs beside a newer stack: there :func:`notice`
says once which package is outside the window, and the reaches into its internals
(:mod:`packsim.core.upstream`) name the version when they no longer fit.

Lessons: none directly (``packsim doctor`` prints :func:`window_lines`).
"""

from __future__ import annotations

import importlib.metadata
import warnings

from packaging.version import InvalidVersion, Version

__all__ = ["STACK", "TESTED", "installed", "notice", "outside", "stack_line", "warn_outside", "window_lines"]

# package -> (lowest tested, newest tested): read by tests/test_upstream_window.py against the
# constraints files, so they never disagree
TESTED = {
    "torch": ("2.13.0", "2.15.0"),
    "transformers": ("5.16.1", "5.25.0"),
    "trl": ("1.9.0", "1.16.0"),
    "accelerate": ("1.13.0", "1.16.0"),
}
# the packages a stack is named by (tests, CI legs, doctor): the window's, and what they run on
STACK = (*TESTED, "kernels", "datasets", "tokenizers")
_warned: set[str] = set()


def installed(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def outside(package: str, version: str | None = None) -> str:
    """'' when ``package`` (at ``version``, default: installed; not installed counts as inside) is
    in the tested window, else one line naming the version and the window."""
    version = version if version is not None else installed(package)
    if version is None or package not in TESTED:
        return ""
    low, high = TESTED[package]
    try:
        v = Version(version)
    except InvalidVersion:
        return f"{package} {version} is not a version packsim can compare (tested: {low} to {high})"
    base = Version(v.base_version)  # 5.26.0.dev0 counts as 5.26.0: newer than tested
    if Version(low) <= base <= Version(high):
        return ""
    side = "older than" if base < Version(low) else "newer than"
    return (f"{package} {version} is {side} packsim's tested window ({low} to {high}); the audit may not "
            f"measure here: pip install '{package}>={low},<={high}', or see packsim doctor")


def notice(version: str | None = None) -> str:
    """The transformers line of :func:`outside`, for a reach that no longer fits (the cause, named)."""
    import transformers

    version = version or transformers.__version__
    return outside("transformers", version) or f"transformers {version} is inside the tested window"


def warn_outside() -> list[str]:
    """Warn once per process for each package outside the window (``UserWarning``); returns the lines."""
    lines = [line for p in TESTED if (line := outside(p))]
    for line in lines:
        if line not in _warned:
            _warned.add(line)
            warnings.warn(f"packsim: {line}", UserWarning, stacklevel=2)
    return lines


def window_lines() -> list[tuple[str, bool, str]]:
    """(package, inside, detail) per package of the window, for ``packsim doctor``."""
    out = []
    for package, (low, high) in TESTED.items():
        version = installed(package)
        line = outside(package, version)
        detail = line or (f"{version} (tested {low} to {high})" if version else f"not installed (tested {low} to {high})")
        out.append((package, not line, detail))
    return out


def stack_line() -> str:
    """'torch 2.13.0+cpu, transformers 5.25.0, ...' for the installed stack (absent packages left out)."""
    return ", ".join(f"{p} {v}" for p in STACK if (v := installed(p)))
