"""The packsim command line: ``python -m packsim`` is the ``packsim`` script; bad input is one line, exit 2."""

import subprocess
import sys
from pathlib import Path

import pytest

from packsim.cli import main

SCRIPT = Path(sys.executable).with_name("packsim")  # the console script next to this interpreter


def test_doctor_passes_here(capsys):
    assert main(["doctor", "--quiet"]) == 0
    assert "all required checks passed" in capsys.readouterr().out


def test_unknown_command_shows_usage(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["fly"])
    assert exc.value.code == 2 and "doctor" in capsys.readouterr().err


# ---- python -m packsim -------------------------------------------------------------------------


def _cli(*args: str, module: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "packsim", *args] if module else [str(SCRIPT), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(not SCRIPT.exists(), reason=f"no packsim script next to {sys.executable}")
@pytest.mark.parametrize("args", [["--help"], ["compare", "--seeds", "0"]], ids=["help", "bad-option"])
def test_python_m_packsim_behaves_like_the_script(args):
    as_module, as_script = _cli(*args), _cli(*args, module=False)
    assert (as_module.returncode, as_module.stdout, as_module.stderr) == (
        as_script.returncode, as_script.stdout, as_script.stderr)
    if args == ["--help"]:
        assert as_module.returncode == 0 and all(c in as_module.stdout for c in ("doctor", "compare", "audit"))
    else:
        assert as_module.returncode == 2 and "Traceback" not in as_module.stderr
        assert as_module.stderr == "packsim compare: error: --seeds 0: must be at least 1.\n"


def test_import_packsim_and_help_load_no_library_module():
    """`import packsim` loads the lazy-name machinery only; `packsim --help` imports no torch."""
    code = ("import sys\nimport packsim\nprint(sorted(m for m in sys.modules if m.startswith('packsim')))\n"
            "print('torch' in sys.modules)\nfrom packsim.cli import main\ntry:\n    main(['--help'])\n"
            "except SystemExit:\n    pass\nprint('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "['packsim', 'packsim.core', 'packsim.core.lazy', 'packsim.core.version']"
    assert lines[1] == "False" and lines[-1] == "False"


def test_only_the_chosen_subcommand_is_imported():
    """`packsim compare` must not need plotly (only `packsim report` does): a GPU box may lack it."""
    code = ("import sys\nfrom packsim.cli import main\ntry:\n    main(['compare', '--help'])\n"
            "except SystemExit:\n    pass\nprint(sorted(m for m in ('plotly', 'packsim.viz.comparison_report') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("argv", [["compare", "--bogus"], ["compare", "--data", "nope"], ["train", "--bogus"],
                                  ["train", "--steps", "x"], ["train", "--help"], ["audit", "--bogus"],
                                  ["audit", "--help"], ["report", "--bogus"], ["doctor", "--bogus"],
                                  ["compare", "--seeds", "0"]])
def test_a_bad_option_answers_without_importing_torch(argv):
    """An option argparse rejects, a number below its minimum, or --help answers before torch loads."""
    code = (f"import sys\nfrom packsim.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit as e:\n"
            "    print('exit', e.code, file=sys.stderr)\nprint('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"
    assert out.stderr.strip().splitlines()[-1] == ("exit 0" if "--help" in argv else "exit 2")
    assert "Traceback" not in out.stderr


# ---- bad input: one line on stderr, exit 2, nothing trained or lost --------------------------

BAD_INPUT = {  # id: (argv, what the line says); TMP is a temp folder, FILE a regular file in it
    "compare-seeds-0": (["compare", "--seeds", "0"], "--seeds 0: must be at least 1"),
    "compare-steps-0": (["compare", "--steps", "0"], "--steps 0: must be at least 1"),
    "compare-steps-text": (["compare", "--steps", "ten"], "argument --steps: invalid int value: 'ten'"),
    "compare-jobs-0": (["compare", "--jobs", "0"], "--jobs 0: must be at least 1"),
    "compare-copies-0": (["compare", "--data", "facts", "--copies", "0"], "--copies 0: must be at least 1"),
    "compare-setups-nonsense": (["compare", "--setups", "nonsense"], "unknown setup 'nonsense'"),
    "compare-setups-empty": (["compare", "--setups", ","], "--setups ',' names no setup"),
    "compare-data-typo": (["compare", "--data", "fact"], "argument --data: invalid choice: 'fact'"),
    "compare-device": (["compare", "--device", "gpu0"], "unknown device 'gpu0'"),
    "compare-out-under-file": (["compare", "--out", "FILE/run"], "--out FILE/run: cannot write there"),
    "compare-out-is-file": (["compare", "--out", "FILE"], "--out FILE: cannot write there (a file, not a folder)"),
    "report-missing-dir": (["compare-report", "TMP/missing"], "no results at TMP/missing/results.json"),
    "report-not-json": (["compare-report", "TMP/broken"], "TMP/broken: its results.json is not a packsim comparison"),
    "report-out-under-file": (["report", "RESULTS", "--out", "FILE/r.html"],
                              "cannot write the report to FILE/r.html (FILE is a file, not a folder)"),
    "audit-setups-nonsense": (["audit", "--setups", "nonsense"], "unknown setup 'nonsense'"),
    "audit-examples-0": (["audit", "--examples", "0"], "--examples 0: must be at least 1"),
    "audit-seed-text": (["audit", "--seed", "x"], "argument --seed: invalid int value: 'x'"),
}


@pytest.fixture
def paths(tmp_path, monkeypatch):
    """TMP, FILE (a regular file), RESULTS (a finished run that must survive) and a broken run."""
    monkeypatch.chdir(tmp_path)  # a default --out would land here, never in the repository
    (tmp_path / "a-file").write_text("keep me\n")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "results.json").write_text("{")
    results = Path(__file__).resolve().parent.parent / "results" / "tasks-full"
    return {"TMP": str(tmp_path), "FILE": str(tmp_path / "a-file"), "RESULTS": str(results)}


@pytest.mark.parametrize("argv, says", BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_input_prints_one_line_and_exits_2(argv, says, paths, capsys, monkeypatch):
    import packsim.experiment.comparison as comparison

    def no_training(*args, **kwargs):
        raise AssertionError("bad input must be rejected before any training starts")

    monkeypatch.setattr(comparison, "run_comparison", no_training)  # compare_command imports it in run()
    fill = lambda s: s.replace("TMP", paths["TMP"]).replace("FILE", paths["FILE"]).replace(  # noqa: E731
        "RESULTS", paths["RESULTS"])
    with pytest.raises(SystemExit) as exc:
        main([fill(a) for a in argv])
    out, err = capsys.readouterr()
    assert exc.value.code == 2
    assert err.startswith(f"packsim {argv[0]}: error: ") and fill(says) in err, err
    assert err.count("\n") == 1 and "Traceback" not in err and out == ""
    assert Path(paths["FILE"]).read_text() == "keep me\n"  # nothing already written is lost


def test_library_errors_stay_packsim_errors_in_python():
    from packsim.core.errors import PacksimError
    from packsim.experiment.comparison import experiment_config
    from packsim.experiment.results import Results

    with pytest.raises(PacksimError, match="unknown setup 'nonsense'"):
        experiment_config("tasks", setups=["nonsense"])
    with pytest.raises(PacksimError, match="no results at"):
        Results.load("no/such/folder")


def test_public_api_docstring_and_all_agree():
    """Every name in packsim.__all__ is in the package docstring and resolves."""
    import packsim

    assert [n for n in packsim.__all__ if n not in packsim.__doc__] == []
    assert all(getattr(packsim, n) is not None for n in packsim.__all__)


def test_every_subcommand_is_a_module_of_packsim_commands_and_report_is_compare_reports_old_name(capsys):
    """The commands live in one room (packsim.commands, one module each with add_arguments and run); the
    comparison's HTML rebuild is named for what it is, its old name still answers."""
    import importlib

    from packsim.commands import ALIASES, SUBCOMMANDS

    for name, (module, _help) in SUBCOMMANDS.items():
        assert module.startswith("packsim.commands."), (name, module)
        loaded = importlib.import_module(module)
        assert callable(loaded.run), name
    assert ALIASES == {"report": "compare-report"}
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "compare-report" in out and "not the audit's report" in out
