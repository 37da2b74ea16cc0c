"""packsim's own requirements, read for ``packsim doctor``: ``pyproject.toml`` in a checkout, else the
installed distribution's metadata; each reduced to its name, ``>=`` bound and extra, and the installed
version compared with that bound.

Lessons: none directly (:mod:`packsim.commands.doctor` reads them).
"""

from __future__ import annotations

import importlib.metadata as metadata
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Requirement", "at_least", "installed_version", "project_requirements"]

_PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


@dataclass(frozen=True)
class Requirement:
    """One line of packsim's requirements, reduced to what the checks need."""

    name: str
    lower: str | None  # the ">=" bound, if any
    extra: str | None  # None for a core dependency


_REQ_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*([^;]*?)\s*(?:;(.*))?$")


def _parse_req(text: str, extra: str | None = None) -> Requirement:
    m = _REQ_RE.match(text)
    if not m:
        return Requirement(text.strip(), None, extra)
    name, spec, marker = m.groups()
    lower = None
    for part in spec.split(","):
        part = part.strip()
        if part.startswith(">="):
            lower = part[2:].strip()
    if marker:
        em = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", marker)
        if em:
            extra = em.group(1)
    return Requirement(name, lower, extra)


def _load_toml(path: Path) -> dict | None:
    try:
        import tomllib
    except ImportError:  # a Python without tomllib (older than 3.11)
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            return None
    with open(path, "rb") as f:
        return tomllib.load(f)


def project_requirements() -> tuple[list[Requirement], str, str | None]:
    """(requirements, where they came from, requires-python) for packsim.

    From ``pyproject.toml`` next to the package (a source checkout) when it can be read, else
    from the installed ``packsim`` distribution's metadata.
    """
    if _PYPROJECT.is_file():
        data = _load_toml(_PYPROJECT)
        project = (data or {}).get("project", {})
        if project.get("name") == "packsim":
            reqs = [_parse_req(r) for r in project.get("dependencies", [])]
            for extra, items in project.get("optional-dependencies", {}).items():
                reqs += [_parse_req(r, extra) for r in items]
            return reqs, str(_PYPROJECT), project.get("requires-python")
    try:
        dist = metadata.distribution("packsim")
    except metadata.PackageNotFoundError:
        return [], "nowhere (no pyproject.toml and packsim is not installed)", None
    reqs = [_parse_req(r) for r in (dist.requires or [])]
    return reqs, "installed packsim metadata", dist.metadata.get("Requires-Python")


def _version_tuple(v: str) -> tuple[int, ...]:
    """Numeric release part of a version: the numbers before a local label ('+cpu') or a pre-release tag
    ('rc1'), e.g. '0.20rc1' -> (0, 20)."""
    nums = []
    for piece in v.split("+")[0].split("."):
        m = re.match(r"\d+", piece)
        if not m:
            break
        nums.append(int(m.group()))
        if m.group() != piece:  # '20rc1': stop after the number
            break
    while len(nums) > 1 and nums[-1] == 0:
        nums.pop()
    return tuple(nums)


def at_least(installed: str, lower: str) -> bool:
    try:
        from packaging.version import Version

        return Version(installed).release >= Version(lower).release
    except Exception:  # packaging missing, or an odd version string
        return _version_tuple(installed) >= _version_tuple(lower)


def installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
