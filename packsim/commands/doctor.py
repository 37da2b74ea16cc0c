"""Check that this environment can run packsim: ``python -m packsim.commands.doctor [--quiet] [--course]``.

Prints one line per requirement (``OK``, ``FAIL``, or ``--`` for an optional thing that is
missing here) and a summary; exits 1 when a required check fails. ``packsim doctor`` runs the same checks.

Checked: the Python version, every dependency in ``pyproject.toml`` ``[project].dependencies``
(installed version against its lower bound: the library, the audit and the CLI), the optional
extras, transformers / TRL / accelerate against the tested window, the device, ``PACKSIM_FAST``, that the tokenizer builds offline, and which attention
backends work here. The ``course`` extra's packages (jupyterlab, plotly, ...) are what the
notebooks need, not the library: each missing one is a ``--`` line saying so, with one line
before the summary naming the install command; ``--course`` (``make setup``) makes them required.
One line per package: TRL, in the ``course``, ``trl`` and ``bench`` extras, is ``trl [course,trl,bench]``.

The checks are the library's (the audit and the CLI need no course package); ``--course`` adds the
course's as required. The requirements are read by :mod:`packsim.commands.requirements`.

Lessons: 00.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass

from packsim.commands.requirements import (
    Requirement,
    at_least,
    installed_version,
    project_requirements,
)

__all__ = ["Check", "Requirement", "run_checks", "main", "project_requirements"]


@dataclass(frozen=True)
class Check:
    """One line of the report. ``required=False`` checks never make the exit code 1."""

    name: str
    ok: bool
    detail: str
    required: bool = True
    extras: tuple[str, ...] = ()  # the extras naming this package; () for everything else

    @property
    def label(self) -> str:
        if self.ok:
            return "OK"
        return "FAIL" if self.required else "--"


COURSE = "course"  # the extra the notebooks need (pyproject.toml)


def _install(extra: str | None, checkout: bool) -> str:
    """The pip command for packsim (with ``extra``): editable in a source checkout."""
    if checkout:
        return "pip install -e ." if extra is None else f"pip install -e '.[{extra}]'"
    return "pip install packsim" if extra is None else f"pip install 'packsim[{extra}]'"


def _req_check(req: Requirement, checkout: bool = True, course: bool = False,
               extras: tuple[str, ...] = ()) -> Check:
    """One requirement's line. ``extras``: every extra naming the package (default: its own);
    ``course``: a package of the course extra is required (``--course``)."""
    installed = installed_version(req.name)
    bound = f">={req.lower}" if req.lower else "(any version)"
    if req.extra is None:
        name = req.name
        if installed is None:
            where = " (or make setup)" if checkout else ""
            return Check(
                name, False, f"not installed, need {bound}: run {_install(None, checkout)}{where}"
            )
        if req.lower and not at_least(installed, req.lower):
            return Check(
                name,
                False,
                f"{installed} is too old, need {bound}: pip install -U '{req.name}{bound}'",
            )
        return Check(name, True, f"{installed} (need {bound})")

    extras = extras or (req.extra,)
    name = f"{req.name} [{','.join(extras)}]"
    required = course and COURSE in extras
    if COURSE in extras:
        why = "course extra" if installed else "needed by the course notebooks, not the library or the audit"
        hint = f": {_install(COURSE, checkout)}"
        if "trl" in extras and not installed:  # packsim audit --collator trl-* needs only this one
            hint += f" (TRL alone, for packsim audit --collator trl-*: {_install('trl', checkout)})"
    elif req.extra == "gpu":
        why, hint = "optional, GPU only", ""
    else:
        why, hint = f"optional, extra '{req.extra}'", f": {_install(req.extra, checkout)}"
    if installed is None:
        return Check(name, False, f"not installed ({why}){hint}", required, extras)
    if req.lower and not at_least(installed, req.lower):
        return Check(name, False, f"{installed} is older than {bound} ({why}); upgrade it",
                     required, extras)
    return Check(name, True, f"{installed} (need {bound}, {why})", required, extras)


def _extra_checks(reqs: list[Requirement], checkout: bool, course: bool) -> list[Check]:
    """One line per package of the extras (course first), listing every extra that names it."""
    order: dict[str, Requirement] = {}
    named: dict[str, list[str]] = {}
    bounds: dict[str, dict[str, str | None]] = {}
    extra_reqs = sorted((r for r in reqs if r.extra is not None), key=lambda r: r.extra != COURSE)
    for r in extra_reqs:
        key = re.sub(r"[-_.]+", "-", r.name).lower()
        order.setdefault(key, r)
        bounds.setdefault(key, {})[r.extra] = r.lower
        if r.extra not in named.setdefault(key, []):
            named[key].append(r.extra)
    return [_lower_extras(_req_check(r, checkout, course, tuple(named[k])), r, bounds[k])
            for k, r in order.items()]


def _lower_extras(check: Check, req: Requirement, bounds: dict[str, str | None]) -> Check:
    """A package too old for the course but enough for another extra naming it at a lower bound (e.g. a
    TRL the audit's ``trl`` extra accepts and the course's extra does not: pyproject.toml has the bounds)
    says so, instead of only "too old"."""
    installed = installed_version(req.name)
    if check.ok or installed is None or check.required:
        return check
    enough = [e for e, low in bounds.items() if e != COURSE and (low is None or at_least(installed, low))]
    if not enough:
        return check
    needs = ", ".join(f"[{e}] >={bounds[e]}" for e in enough)
    return Check(check.name, False, f"{installed}: enough for {needs} (the audit); the course extra needs "
                 f">={bounds.get(COURSE)}: pip install -U '{req.name}>={bounds.get(COURSE)}' for the notebooks",
                 False, check.extras)


# ---------------------------------------------------------------------------------------------
# checks


def _python_check(requires_python: str | None) -> Check:
    have = ".".join(map(str, sys.version_info[:3]))
    m = re.search(r">=\s*([\d.]+)", requires_python or "")
    lower = m.group(1) if m else "3.10"
    if at_least(have, lower):
        return Check("python", True, f"{have} (need >={lower}) at {sys.executable}")
    return Check("python", False, f"{have} is too old, need >={lower}: install a newer Python")


def _window_checks() -> list[Check]:
    """One line per package of the tested window (packsim.core.upstream.window): a version outside it is
    a ``--`` line (the audit warns there, and may answer NOT MEASURED), never a FAIL."""
    from packsim.core.upstream.window import window_lines

    return [Check(f"window/{package}", inside, detail, required=False) for package, inside, detail in window_lines()]


def _device_checks() -> list[Check]:
    try:
        import torch

        from packsim.core.device import get_device

        device = get_device()
    except Exception as e:  # torch missing, or PACKSIM_DEVICE asks for something absent
        return [Check("device", False, f"{type(e).__name__}: {e}")]
    cuda_build = torch.version.cuda
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        name = torch.cuda.get_device_name(index)
        detail = f"cuda:{index} ({name}), torch {torch.__version__}, CUDA {cuda_build}"
    else:
        build = f"CUDA {cuda_build} build" if cuda_build else "CPU-only build"
        detail = f"{device.type} (torch {torch.__version__}, {build}; no GPU needed for the course)"
    return [Check("device", True, detail)]


def _fast_mode_check() -> Check:
    from packsim.experiment.run_mode import fast_mode

    raw = os.environ.get("PACKSIM_FAST")
    if raw is None:
        detail = "not set (full mode: notebooks run full-size experiments)"
    else:
        detail = f"set to {raw!r}: " + ("fast mode (small, quick runs)" if fast_mode() else "full mode")
    return Check("PACKSIM_FAST", True, detail)


def _tokenizer_check() -> Check:
    try:
        from packsim.core.tokenizer import build_tokenizer, decode, encode_strict

        tok = build_tokenizer()
        sample = "rev abc=cba"
        if decode(encode_strict(sample)) != sample:
            return Check("tokenizer", False, "encode/decode roundtrip failed: please report this")
        return Check("tokenizer", True, f"built offline, {len(tok)} tokens, roundtrip exact")
    except Exception as e:
        return Check("tokenizer", False, f"could not build: {type(e).__name__}: {e}")


def _attention_checks() -> list[Check]:
    try:
        from packsim.core.attention_backends import available_backends
    except Exception as e:
        return [
            Check(
                "attention",
                False,
                f"attention module unavailable ({type(e).__name__}: {e}); "
                "reinstall packsim (pip install -e .) or report this",
            )
        ]
    try:
        backends = dict(available_backends())
    except Exception as e:
        return [
            Check(
                "attention",
                False,
                f"available_backends() failed ({type(e).__name__}: {e}); please report this",
            )
        ]
    checks = []
    usable = [name for name, st in backends.items() if st.available and st.trains]
    for name, st in backends.items():
        if st.available:
            detail = f"available, {'trains' if st.trains else 'inference only'} ({st.reason})"
        else:
            detail = f"not available: {st.reason}"
        checks.append(Check(f"attention: {name}", st.available, detail, required=False))
    if usable:
        checks.append(Check("attention", True, f"{len(usable)} backend(s) can train here"))
    else:
        checks.append(
            Check("attention", False, "no attention backend can train here; see the lines above")
        )
    return checks


def run_checks(course: bool = False) -> list[Check]:
    """Run every check and return them in report order (nothing is printed).

    ``course=True``: the course extra's packages are required (a missing one is a FAIL).
    """
    reqs, source, requires_python = project_requirements()
    checkout = source.endswith("pyproject.toml")
    checks = [_python_check(requires_python)]
    if not reqs:
        checks.append(
            Check(
                "dependencies",
                False,
                "could not find packsim's requirements: run from a source checkout "
                "or pip install -e .",
            )
        )
    checks += [_req_check(r, checkout) for r in reqs if r.extra is None]
    checks += _extra_checks(reqs, checkout, course)
    checks += _window_checks()
    checks += _device_checks()
    checks.append(_fast_mode_check())
    checks.append(_tokenizer_check())
    checks += _attention_checks()
    return checks


def _line(c: Check) -> str:
    return f"{c.label:<4}  {c.name:<24} {c.detail}"


def course_note(checks: list[Check], checkout: bool = True) -> str | None:
    """One line when packages of the course extra are missing or too old, else None."""
    ours = [c for c in checks if COURSE in c.extras]
    bad = [c.name.split(" [")[0] for c in ours if not c.ok]
    if not bad:
        return None
    return (f"course extra: {len(bad)} of {len(ours)} packages missing or too old ({', '.join(bad)}): "
            f"the library, the audit and the CLI work without them; for the notebooks "
            f"{_install(COURSE, checkout)}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``packsim doctor`` / ``python -m packsim.commands.doctor``."""
    parser.add_argument(
        "--quiet", "-q", action="store_true", help="print only failures and a one-line summary"
    )
    parser.add_argument(
        "--course", action="store_true",
        help="the course extra's packages (the notebooks') are required too, as make setup checks",
    )


def main(argv: list[str] | None = None) -> int:
    """Print the report; return 0 when every required check passes, else 1."""
    parser = argparse.ArgumentParser(
        prog="python -m packsim.commands.doctor",
        description="Check that this environment can run packsim.",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """``packsim doctor``: see :func:`main`."""
    course = getattr(args, "course", False)
    checks = run_checks(course=course)
    failed = [c for c in checks if not c.ok and c.required]
    _reqs, source, _ = project_requirements()
    if not args.quiet:
        print(f"packsim environment check (requirements from {source})")
    for c in checks:
        if not args.quiet or (not c.ok and c.required):
            print(_line(c))
    note = course_note(checks, source.endswith("pyproject.toml"))
    if note and not course:
        print(note)
    n_ok = sum(c.ok for c in checks)
    if failed:
        print(
            f"packsim doctor: {len(failed)} FAIL, {n_ok} OK of {len(checks)} checks: "
            "fix the FAIL lines above, then rerun python -m packsim.commands.doctor"
        )
        return 1
    print(f"packsim doctor: all required checks passed ({n_ok} OK of {len(checks)} checks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
