"""Project files agree with each other, and the environment check passes here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from packsim.course import doctor

ROOT = Path(__file__).resolve().parent.parent

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

CONDA_TO_PIP = {"pytorch": "torch"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _split(req: str) -> tuple[str, str | None]:
    """'torch>=2.6' -> ('torch', '2.6'); a name without a '>=' bound -> (name, None)."""
    m = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(.*?)\s*", req)
    assert m, f"cannot parse requirement {req!r}"
    name, spec = m.groups()
    bound = re.search(r">=\s*([0-9][0-9A-Za-z.]*)", spec)
    return _norm(CONDA_TO_PIP.get(_norm(name), name)), (bound.group(1) if bound else None)


def _pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def _environment_yml() -> dict:
    text = (ROOT / "environment.yml").read_text()
    try:
        import yaml
    except ImportError:
        return _parse_env_lines(text)
    return yaml.safe_load(text)


def _parse_env_lines(text: str) -> dict:
    """Just enough YAML for environment.yml: top-level keys, '- item' lists, one nested pip list."""
    out: dict = {}
    key = None
    pip: list | None = None
    for raw in text.splitlines():
        line = raw.split(" #")[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip():
            continue
        if not line.startswith(" ") and line.endswith(":"):
            key, pip = line[:-1], None
            out[key] = []
        elif not line.startswith(" ") and ":" in line:
            k, v = line.split(":", 1)
            out[k.strip()] = v.strip()
        else:
            item = line.strip().removeprefix("- ").strip().strip("\"'")
            if item == "pip:":
                pip = []
                out[key].append({"pip": pip})
            elif pip is not None and len(raw) - len(raw.lstrip()) > 4:
                pip.append(item)
            else:
                out[key].append(item)
    return out


def test_env_line_parser_matches_yaml():
    yaml = pytest.importorskip("yaml")
    text = (ROOT / "environment.yml").read_text()
    assert _parse_env_lines(text) == yaml.safe_load(text)


def _conda_parts() -> tuple[list[str], list[str]]:
    deps = _environment_yml()["dependencies"]
    conda = [d for d in deps if isinstance(d, str)]
    pip = [x for d in deps if isinstance(d, dict) for x in d.get("pip", [])]
    return conda, pip


def test_environment_yml_matches_pyproject_dependencies():
    project = _pyproject()["project"]
    pip_deps = dict(_split(r) for r in project["dependencies"])
    conda, _ = _conda_parts()
    conda_deps = dict(_split(r) for r in conda if _split(r)[0] not in ("python", "pip"))
    assert conda_deps == pip_deps, (
        "environment.yml and pyproject.toml [project].dependencies disagree: "
        "update both (same packages, same '>=' lower bounds; conda's torch is 'pytorch')"
    )
    assert all(bound for bound in pip_deps.values()), "every dependency needs a lower bound"


def test_python_bound_matches_requires_python():
    conda, _ = _conda_parts()
    python = dict(_split(r) for r in conda)["python"]
    assert f">={python}" == _pyproject()["project"]["requires-python"].replace(" ", "")


def test_environment_yml_uses_conda_forge_and_pip_installs_dev_extra():
    env = _environment_yml()
    assert env["channels"] == ["conda-forge"]
    conda, pip = _conda_parts()
    assert "pip" in conda
    assert pip == ["-e .[dev]"]
    assert "pytest" in {
        _split(r)[0] for r in _pyproject()["project"]["optional-dependencies"]["dev"]
    }
    assert '.[dev]"' in (ROOT / "Makefile").read_text(), "make setup installs the dev extra too"


def test_doctor_reads_the_same_requirements():
    reqs, source, requires_python = doctor.project_requirements()
    assert source.endswith("pyproject.toml")
    core = {_norm(r.name): r.lower for r in reqs if r.extra is None}
    assert core == dict(_split(r) for r in _pyproject()["project"]["dependencies"])
    assert requires_python == _pyproject()["project"]["requires-python"]


def test_doctor_quiet_passes_here(capsys):
    code = doctor.main(["--quiet"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "FAIL" not in out
    assert out.strip().splitlines()[-1].startswith("packsim doctor: all required checks passed")


@pytest.mark.slow
def test_doctor_runs_as_module():
    proc = subprocess.run(
        [sys.executable, "-m", "packsim.course.doctor"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    ok = [line for line in lines if line.startswith("OK ")]
    names = {line.split()[1] for line in ok}
    assert {"python", "torch", "transformers", "tokenizers", "device", "tokenizer"} <= names
    assert any(line.split()[1] == "PACKSIM_FAST" for line in lines)
    assert any("flash-attn" in line and not line.startswith("FAIL") for line in lines)
    assert any(line.startswith("OK    attention") for line in lines)


def test_doctor_flags_a_too_old_dependency(monkeypatch):
    monkeypatch.setattr(doctor, "_installed", lambda name: "0.1" if name == "numpy" else "99")
    checks = {c.name: c for c in doctor.run_checks()}
    assert not checks["numpy"].ok and checks["numpy"].required
    assert "too old" in checks["numpy"].detail and "pip install -U" in checks["numpy"].detail
    assert checks["torch"].ok


def test_doctor_missing_optional_is_not_a_failure(monkeypatch):
    real = doctor._installed
    monkeypatch.setattr(doctor, "_installed", lambda n: None if n == "flash-attn" else real(n))
    checks = {c.name: c for c in doctor.run_checks()}
    flash = checks["flash-attn [gpu]"]
    assert not flash.required and "not installed (optional, GPU only)" in flash.detail


def test_doctor_falls_back_to_installed_metadata(monkeypatch, tmp_path):
    monkeypatch.setattr(doctor, "_PYPROJECT", tmp_path / "missing.toml")
    reqs, source, _ = doctor.project_requirements()
    assert source == "installed packsim metadata"
    names = {_norm(r.name) for r in reqs if r.extra is None}
    assert {"torch", "transformers", "tokenizers"} <= names  # (metadata may lag pyproject edits)
    assert any(r.extra == "dev" for r in reqs)
