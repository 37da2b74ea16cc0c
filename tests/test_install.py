"""``pip install packsim`` without its extras: the wheel, installed on its own, runs the audit gate.

The module fixture builds the wheel from a copy of the source tree (``pip wheel --no-deps
--no-build-isolation``: offline, the working tree untouched), checks that every package-data file
(the quiz YAMLs, everything under ``packsim/viz/frontend/``) is inside and that its metadata keeps
the course packages and TRL in extras, and installs it non-editable into ``TMP/site``. ``TMP/lean``
holds links to only the distributions the wheel's own requirements reach in this venv (torch,
transformers, accelerate, numba, ... and theirs), so plotly, ipywidgets, jupyterlab, nbconvert, TRL
and datasets are absent there as in a fresh ``pip install packsim``. One child ``python -I -S``
(no site-packages, no ``.pth`` files, so not the editable install) puts ``TMP/site`` then
``TMP/lean`` first on ``sys.path``, blocks those names on the meta path, and refuses ``yaml`` to
packsim's own import statements (an ``__import__`` hook: pyyaml comes with transformers and
huggingface_hub imports it first, so it cannot be absent; packsim must not need it outside the course). In it run ``python -m packsim audit
--trainer FILE.py:FUNC`` on two tiny ``Trainer`` factories (exit 0, and 1 for a leaking one), the
demo, the pre-flight gate with the ``packsim`` collator (exit 0 without datasets) and with
``trl-bfd`` (exit 2, the one line naming the ``trl`` extra), and ``packsim.viz`` names (the one
line naming the ``course`` extra). The in-process tests check the same messages cheaply.
"""

from __future__ import annotations

import email
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from packsim.core.errors import PacksimError

ROOT = Path(__file__).resolve().parent.parent
ABSENT = ("plotly", "ipywidgets", "jupyterlab", "nbconvert", "trl", "datasets")  # not in pip install packsim
COURSE_ONLY = {"jupyterlab", "ipykernel", "ipywidgets", "plotly", "pyyaml", "nbconvert", "trl"}
COURSE_LINE = 'needs the course extra (plotly, ipywidgets are not installed here): pip install "packsim[course]"'
TRL_LINE = 'needs TRL (trl is not installed here): pip install "packsim[trl]"'


# ------------------------------------------------------------------------------ in process (fast)


def test_require_names_the_extra_in_one_line(monkeypatch):
    from packsim.core.extras import missing, require

    monkeypatch.setitem(sys.modules, "plotly", None)  # `import plotly` now fails, as if not installed
    assert missing("plotly", "json", "no_such_module_here") == ["plotly", "no_such_module_here"]
    require("anything", "course", "json")  # present: nothing raised
    with pytest.raises(PacksimError) as err:
        require("packsim.viz.x", "course", "plotly", "no_such_module_here")
    assert str(err.value) == ('packsim.viz.x needs the course extra (plotly, no_such_module_here are not '
                              'installed here): pip install "packsim[course]"')
    with pytest.raises(PacksimError, match="unknown extra 'nope'"):
        require("x", "nope", "json")


def test_a_viz_name_without_the_course_extra_is_one_line(monkeypatch):
    import packsim.viz as viz

    for name in ("leakage_explorer", "use_figure_config", "load_quizzes"):
        monkeypatch.delitem(vars(viz), name, raising=False)  # loaded by another test file: forget it
    monkeypatch.setitem(sys.modules, "ipywidgets", None)
    with pytest.raises(PacksimError) as err:
        viz.leakage_explorer  # noqa: B018
    assert str(err.value) == ('packsim.viz.leakage_explorer needs the course extra (ipywidgets is not '
                              'installed here): pip install "packsim[course]"')
    assert callable(viz.use_figure_config)  # plotly only: served without ipywidgets
    monkeypatch.setitem(sys.modules, "yaml", None)
    with pytest.raises(PacksimError, match=r"^packsim.viz.load_quizzes needs the course extra \(yaml is"):
        viz.load_quizzes  # noqa: B018


def test_trl_collators_without_trl_are_one_line(monkeypatch):
    from packsim.auditing.preflight import build_trainer

    monkeypatch.setitem(sys.modules, "trl", None)
    with pytest.raises(PacksimError) as err:  # checked before the model or the data are touched
        build_trainer(None, None, [], "trl-wrapped", "unused")
    assert str(err.value) == f"--collator trl-wrapped {TRL_LINE}"


# ------------------------------------------------------------------------------ the wheel


def _copy_source(dst: Path) -> Path:
    """pyproject.toml, README.md and packsim/ (no caches): the build writes its egg-info here, not in the tree."""
    dst.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dst / name)
    shutil.copytree(ROOT / "packsim", dst / "packsim",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    return dst


def _pip(*args: str, cwd: Path) -> None:
    env = {**os.environ, "PIP_NO_INPUT": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    proc = subprocess.run([sys.executable, "-m", "pip", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]


def _closure(requires: list[str]) -> list[metadata.Distribution]:
    """The installed distributions ``requires`` (a wheel's Requires-Dist, no extras) reaches, markers evaluated."""
    found: dict[str, metadata.Distribution] = {}
    todo = [(Requirement(r), "") for r in requires]
    seen: set[tuple[str, frozenset]] = set()
    while todo:
        req, parent_extra_env = todo.pop()
        if req.marker and not any(req.marker.evaluate({"extra": e}) for e in parent_extra_env.split(",")):
            continue
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            continue  # not here, so not in the venv either: nothing to link
        found[key[0]] = dist
        extras_env = ",".join(["", *sorted(req.extras)])
        todo += [(Requirement(r), extras_env) for r in dist.requires or []]
    return list(found.values())


def _link_lean_site(dists: list[metadata.Distribution], lean: Path) -> set[str]:
    """Symlink each distribution's top-level files and folders (dist-info included) into ``lean``."""
    lean.mkdir()
    tops: set[str] = set()
    for dist in dists:
        files = dist.files or []
        mine = {f.parts[0] for f in files if f.parts and f.parts[0] not in ("..", "__pycache__")}
        if not files:
            mine = set((dist.read_text("top_level.txt") or "").split())
        for top in mine:
            target = Path(dist.locate_file(top))  # purelib or platlib, wherever this one lives
            if target.exists() and not (lean / top).exists():
                (lean / top).symlink_to(target)
        tops |= mine
    return tops


DRIVER = r'''
"""Run packsim's CLI and a few imports as a lean install would: argv = SITE LEAN WORK."""
import builtins, contextlib, importlib.abc, importlib.util, io, json, runpy, sys

site, lean, work = sys.argv[1:4]
sys.path[:0] = [site, lean]
ABSENT = set(json.loads(sys.argv[4]))


class Blocker(importlib.abc.MetaPathFinder):
    """Belt and braces over the lean site: importing a name pip install packsim lacks fails (a
    find_spec probe, as transformers' availability checks make, falls through to the path, which
    lacks it too)."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ABSENT and not self._probe():
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: not in pip install packsim)", name=name)
        return None

    @staticmethod
    def _probe():
        """Whether importlib.util.find_spec asked (a probe), not an import."""
        frame = sys._getframe(2)
        while frame and ("importlib" in frame.f_code.co_filename or frame.f_code.co_filename.startswith("<frozen")):
            if frame.f_code.co_name == "find_spec":
                return True
            frame = frame.f_back
        return False


sys.meta_path.insert(0, Blocker())
_import = builtins.__import__


def _no_yaml_for_packsim(name, globals=None, locals=None, fromlist=(), level=0):
    """yaml comes with transformers (huggingface_hub imports it), so it is loaded: refuse it to
    packsim's own import statements, every time, as if pip install packsim lacked it."""
    if level == 0 and name.partition(".")[0] == "yaml" and str((globals or {}).get("__name__", "")).startswith("packsim"):
        raise ModuleNotFoundError(f"No module named {name!r} (blocked for packsim: course extra)", name=name)
    return _import(name, globals, locals, fromlist, level)


builtins.__import__ = _no_yaml_for_packsim
results = {"absent_found": [m for m in sorted(ABSENT) if importlib.util.find_spec(m) is not None]}


def run(name, argv=None, code=None):
    out, err = io.StringIO(), io.StringIO()
    rc = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            if argv is not None:  # python -m packsim ARGV
                sys.argv = ["packsim", *argv]
                runpy.run_module("packsim", run_name="__main__", alter_sys=False)
            else:
                exec(code, {})
        except SystemExit as stop:
            rc = stop.code if isinstance(stop.code, int) else 1
        except Exception as exc:  # noqa: BLE001
            rc = f"{type(exc).__name__}: {exc}"
    results[name] = {"rc": rc, "out": out.getvalue(), "err": err.getvalue()}


for name, argv in json.loads(sys.argv[5]).items():
    run(name, argv=argv)
run("viz", code="import packsim.viz\nfrom packsim.viz import leakage_explorer")
run("viz_report", code="from packsim.viz.comparison_report import summary_table")
run("yaml_for_packsim", code="import packsim.viz.quiz_data")  # the blocker's own controls
run("yaml_elsewhere", code="import yaml")  # loaded by now (huggingface_hub): the case that matters
run("import_trl", code="import trl")
import packsim
results["packsim_file"] = packsim.__file__
results["loaded_absent"] = sorted({m.partition(".")[0] for m in sys.modules} & ABSENT)
results["editable"] = sorted(m for m in sys.modules if "editable" in m)  # the checkout's finder: never
print(json.dumps(results))
'''

FACTORY = '''
from transformers import Trainer, TrainingArguments

from packsim import PackingCollator, build_model
from packsim.core.tokenizer import BOS_ID, EOS_ID, encode

PAIRS = [("abc=", "cba"), ("hello:", "olleh"), ("x+y=", "z"), ("sort 321:", "123")]


def _trainer(setup):
    features = [{"prompt_ids": [BOS_ID] + encode(p), "response_ids": encode(c) + [EOS_ID]} for p, c in PAIRS]
    args = TrainingArguments(output_dir=OUT, per_device_train_batch_size=4, max_steps=1, report_to="none",
                             save_strategy="no", use_cpu=True, remove_unused_columns=False, seed=0)
    model = build_model("tiny", attn_implementation="sdpa", seed=0)
    return Trainer(model=model, args=args, train_dataset=features, data_collator=PackingCollator(setup=setup))


def correct():
    return _trainer("correct")  # block-diagonal mask, positions restart, completion-only loss


def leaking():
    return _trainer("buggy")  # one causal mask over the whole row: examples see each other
'''


@pytest.fixture(scope="module")
def lean(tmp_path_factory):
    """Build and install the wheel, link the lean site, run every lean command in one child process."""
    tmp = tmp_path_factory.mktemp("install")
    t0 = time.perf_counter()
    src = _copy_source(tmp / "src")
    _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(tmp / "dist"), str(src),
         cwd=tmp)
    (wheel,) = (tmp / "dist").glob("packsim-*.whl")
    _pip("install", "--no-deps", "--no-index", "-q", "--target", str(tmp / "site"), str(wheel), cwd=tmp)
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = email.message_from_bytes(zf.read(meta)).get_all("Requires-Dist") or []
    built_s = time.perf_counter() - t0

    core = [r for r in requires if not (Requirement(r).marker and "extra" in str(Requirement(r).marker))]
    tops = _link_lean_site(_closure(core), tmp / "lean")

    from packsim.core.model import build_model
    from packsim.core.tokenizer import build_tokenizer

    build_model("tiny", attn_implementation="sdpa", seed=0).save_pretrained(tmp / "ckpt")
    build_tokenizer().save_pretrained(tmp / "ckpt")
    pairs = [("abc=", "cba"), ("hello:", "olleh"), ("x+y=", "z"), ("sort 321:", "123")]
    (tmp / "data.jsonl").write_text("".join(json.dumps({"prompt": p, "completion": c}) + "\n" for p, c in pairs))
    (tmp / "factory.py").write_text(f"OUT = {str(tmp / 'out')!r}\n" + FACTORY)
    (tmp / "driver.py").write_text(DRIVER)
    factory = tmp / "factory.py"
    commands = {
        "trainer_pass": ["audit", "--trainer", f"{factory}:correct"],
        "trainer_fault": ["audit", "--trainer", f"{factory}:leaking"],
        "demo": ["audit", "--setups", "buggy,correct"],
        "preflight": ["audit", "--model", str(tmp / "ckpt"), "--data", str(tmp / "data.jsonl"),
                      "--collator", "packsim"],
        "preflight_trl": ["audit", "--model", str(tmp / "ckpt"), "--data", str(tmp / "data.jsonl"),
                          "--collator", "trl-bfd"],
    }
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    t1 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-I", "-S", str(tmp / "driver.py"), str(tmp / "site"), str(tmp / "lean"),
                           str(tmp), json.dumps(ABSENT), json.dumps(commands)],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    results.update(tmp=tmp, wheel_files=names, requires=requires, tops=tops, built_s=built_s,
                   run_s=time.perf_counter() - t1)
    return results


def test_the_wheel_holds_every_package_data_file(lean):
    data = [p for p in (ROOT / "packsim" / "viz" / "frontend").rglob("*") if p.is_file()]
    data += list((ROOT / "packsim" / "viz" / "quiz_files").glob("*.yaml"))
    data = [p for p in data if "__pycache__" not in p.parts]
    assert len(data) >= 2
    wanted = {p.relative_to(ROOT).as_posix() for p in data}
    assert not wanted - lean["wheel_files"], (
        "package data missing from the wheel: add it to [tool.setuptools.package-data] in pyproject.toml")
    assert "packsim/cli.py" in lean["wheel_files"] and "packsim/viz/__init__.py" in lean["wheel_files"]
    assert "packsim/commands/doctor.py" in lean["wheel_files"]
    tools = sorted(f for f in lean["wheel_files"] if f.startswith("packsim/course/tools/"))
    assert not tools, f"make's tooling shipped in the wheel: {tools} (pyproject's packages.find exclude)"


def test_the_wheel_keeps_the_course_and_trl_in_extras(lean):
    plain = {canonicalize_name(Requirement(r).name) for r in lean["requires"]
             if not (Requirement(r).marker and "extra" in str(Requirement(r).marker))}
    assert plain == {"torch", "transformers", "tokenizers", "numpy", "numba", "tqdm", "accelerate"}
    by_extra: dict[str, set[str]] = {}
    for r in map(Requirement, lean["requires"]):
        for extra in ("course", "trl"):
            if r.marker and r.marker.evaluate({"extra": extra}):
                by_extra.setdefault(extra, set()).add(canonicalize_name(r.name))
    assert by_extra == {"course": COURSE_ONLY, "trl": {"trl"}}


def test_the_lean_site_has_the_library_and_lacks_the_course(lean):
    assert {"torch", "transformers", "accelerate", "numba", "tokenizers"} <= lean["tops"]
    assert lean["absent_found"] == [], "these import in the lean child: the lean site is not lean"
    assert lean["loaded_absent"] == [] and lean["editable"] == []
    assert lean["packsim_file"] == str(lean["tmp"] / "site" / "packsim" / "__init__.py")


def test_the_blocker_refuses_what_it_should(lean):
    """Controls: packsim's own yaml import and a real ``import trl`` fail; yaml elsewhere imports."""
    assert lean["yaml_for_packsim"]["rc"].startswith("ModuleNotFoundError: No module named 'yaml' (blocked")
    assert lean["import_trl"]["rc"].startswith("ModuleNotFoundError: No module named 'trl'")
    assert lean["yaml_elsewhere"]["rc"] == 0


def test_trainer_gate_passes_and_fails_from_the_wheel(lean):
    ok, bad = lean["trainer_pass"], lean["trainer_fault"]
    assert ok["rc"] == 0, ok
    assert "gate PASS" in ok["out"] and "Trainer" in ok["out"]
    assert bad["rc"] == 1, bad  # the causal mask over the row: a fault, found without the course
    assert "gate FAIL:" in bad["out"]


def test_demo_runs_from_the_wheel(lean):
    demo = lean["demo"]
    assert demo["rc"] == 0, demo
    summary = demo["out"].split("summary\n", 1)[1].splitlines()
    assert [line.split()[:2] for line in summary] == [["buggy", "FAIL"], ["correct", "PASS"]]


def test_preflight_runs_without_datasets_and_trl_collators_name_the_extra(lean):
    pre, trl = lean["preflight"], lean["preflight_trl"]
    assert pre["rc"] == 0, pre  # the packsim collator under a plain Trainer: a list, no datasets
    assert "pre-flight PASS" in pre["out"]
    assert trl["rc"] == 2, trl
    assert trl["err"].strip() == f"packsim audit: error: --collator trl-bfd {TRL_LINE}"


def test_viz_without_the_course_extra_is_one_line(lean):
    viz = lean["viz"]
    assert viz["rc"] == f"PacksimError: packsim.viz.leakage_explorer {COURSE_LINE}", viz
    assert lean["viz_report"]["rc"] == 0, lean["viz_report"]  # packsim compare's tables need no plotly
