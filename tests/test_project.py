"""Project files agree with each other, and the environment check passes here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from packsim.commands import doctor, requirements

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


def test_environment_yml_matches_pyproject_dependencies_and_course_extra():
    project = _pyproject()["project"]
    core = dict(_split(r) for r in project["dependencies"])
    course = dict(_split(r) for r in project["optional-dependencies"]["course"])
    conda, _ = _conda_parts()
    conda_deps = dict(_split(r) for r in conda if _split(r)[0] not in ("python", "pip"))
    assert conda_deps == {**core, **course}, (
        "environment.yml and pyproject.toml ([project].dependencies + the course extra) disagree: "
        "update both (same packages, same '>=' lower bounds; conda's torch is 'pytorch')"
    )
    assert all(bound for bound in {**core, **course}.values()), "every dependency needs a lower bound"


# what `pip install packsim` must not pull in: the notebooks' packages and TRL
COURSE_ONLY = {"jupyterlab", "ipykernel", "ipywidgets", "plotly", "pyyaml", "nbconvert", "trl"}
LEAN = {"torch", "transformers", "tokenizers", "numpy", "numba", "tqdm", "accelerate"}


def test_the_plain_install_is_the_library_and_the_extras_add_the_rest():
    project = _pyproject()["project"]
    extras = {k: dict(_split(r) for r in v) for k, v in project["optional-dependencies"].items()}
    core = dict(_split(r) for r in project["dependencies"])
    assert set(core) == LEAN, "pip install packsim is torch + transformers (+ numba, ..., accelerate) alone"
    assert set(extras["course"]) == COURSE_ONLY and not COURSE_ONLY & set(core)
    # the audit's TRL floor is the window's lower end; the course and the packing benchmark need TRL 1.16
    from packsim.core.upstream.window import TESTED

    assert extras["trl"] == {"trl": TESTED["trl"][0].rsplit(".0", 1)[0]}
    assert extras["bench"] == {"trl": extras["course"]["trl"]}
    assert core["transformers"] == TESTED["transformers"][0], "the install bound is the window's lower end"
    assert core["torch"] == TESTED["torch"][0].rsplit(".0", 1)[0], "torch's install bound is the window's lower end"
    assert not (set(extras["dev"]) & COURSE_ONLY), "dev is the test tools; make setup adds course"


def test_python_bound_matches_requires_python():
    conda, _ = _conda_parts()
    python = dict(_split(r) for r in conda)["python"]
    assert f">={python}" == _pyproject()["project"]["requires-python"].replace(" ", "")


def test_environment_yml_uses_conda_forge_and_pip_installs_course_and_dev_extras():
    env = _environment_yml()
    assert env["channels"] == ["conda-forge"]
    conda, pip = _conda_parts()
    assert "pip" in conda
    assert pip == ["-e .[course,dev]"]
    assert "pytest" in {
        _split(r)[0] for r in _pyproject()["project"]["optional-dependencies"]["dev"]
    }
    makefile = (ROOT / "Makefile").read_text()
    assert '-e ".[course,dev]"' in makefile, "make setup (make lab, make test) installs both extras"
    assert "doctor --quiet --course" in makefile, "make setup checks the course extra too"


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
        [sys.executable, "-m", "packsim.commands.doctor"],
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
    monkeypatch.setattr(doctor, "installed_version", lambda name: "0.1" if name == "numpy" else "99")
    checks = {c.name: c for c in doctor.run_checks()}
    assert not checks["numpy"].ok and checks["numpy"].required
    assert "too old" in checks["numpy"].detail and "pip install -U" in checks["numpy"].detail
    assert checks["torch"].ok


def test_doctor_missing_optional_is_not_a_failure(monkeypatch):
    real = doctor.installed_version
    monkeypatch.setattr(doctor, "installed_version", lambda n: None if n == "flash-attn" else real(n))
    checks = {c.name: c for c in doctor.run_checks()}
    flash = checks["flash-attn [gpu]"]
    assert not flash.required and "not installed (optional, GPU only)" in flash.detail


def test_doctor_names_a_missing_course_package_as_the_courses_not_a_failure(monkeypatch, capsys):
    real = doctor.installed_version
    gone = {"plotly", "trl"}
    monkeypatch.setattr(doctor, "installed_version", lambda n: None if n in gone else real(n))
    checks = {c.name: c for c in doctor.run_checks()}
    plotly, trl = checks["plotly [course]"], checks["trl [course,trl,bench]"]  # TRL: one line
    assert not plotly.ok and not plotly.required and plotly.label == "--"
    assert "needed by the course notebooks, not the library or the audit" in plotly.detail
    assert "pip install -e '.[course]'" in plotly.detail
    assert "pip install -e '.[trl]'" in trl.detail and not trl.required
    assert sum(name.startswith("trl ") for name in checks) == 1
    assert doctor.main(["--quiet"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-2] == ("course extra: 2 of 7 packages missing or too old (plotly, trl): the library, the "
                       "audit and the CLI work without them; for the notebooks pip install -e '.[course]'")
    assert out[-1].startswith("packsim doctor: all required checks passed")
    assert doctor.main(["--quiet", "--course"]) == 1  # what make setup runs: the course needs them
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines if line.startswith("FAIL")] == ["plotly", "trl"]


def test_doctor_outside_a_checkout_names_the_wheel_install(monkeypatch):
    monkeypatch.setattr(requirements, "_PYPROJECT", Path("/nonexistent/pyproject.toml"))
    monkeypatch.setattr(doctor, "installed_version", lambda n: None)
    check = doctor._req_check(doctor.Requirement("plotly", "5.24", "course"), checkout=False)
    assert check.detail.endswith("pip install 'packsim[course]'")
    core = doctor._req_check(doctor.Requirement("torch", "2.6", None), checkout=False)
    assert not core.ok and core.required and core.detail.endswith("run pip install packsim")


def test_doctor_falls_back_to_installed_metadata(monkeypatch, tmp_path):
    monkeypatch.setattr(requirements, "_PYPROJECT", tmp_path / "missing.toml")
    reqs, source, _ = doctor.project_requirements()
    assert source == "installed packsim metadata"
    names = {_norm(r.name) for r in reqs if r.extra is None}
    assert {"torch", "transformers", "tokenizers"} <= names  # (metadata may lag pyproject edits)
    assert any(r.extra == "dev" for r in reqs)


def test_doctor_says_a_trl_old_for_the_course_is_enough_for_the_audit(monkeypatch):
    """TRL 1.9 (the window's lower end, Axolotl 0.19's pin): enough for the trl extra, too old for the course."""
    real = doctor.installed_version
    monkeypatch.setattr(doctor, "installed_version", lambda n: "1.9.0" if n == "trl" else real(n))
    trl = {c.name: c for c in doctor.run_checks()}["trl [course,trl,bench]"]
    assert trl.label == "--" and not trl.required
    assert trl.detail.startswith("1.9.0: enough for [trl] >=1.9 (the audit); the course extra needs >=1.16")
    monkeypatch.setattr(doctor, "installed_version", lambda n: "1.8.0" if n == "trl" else real(n))
    assert "enough for" not in {c.name: c for c in doctor.run_checks()}["trl [course,trl,bench]"].detail
    checks = {c.name: c for c in doctor.run_checks(course=True)}
    assert checks["trl [course,trl,bench]"].label == "FAIL"  # make setup needs the course's TRL
