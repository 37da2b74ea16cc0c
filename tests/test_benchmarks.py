"""The benchmark scripts run end to end on tiny sizes and write their tables and JSON.

Speed and memory are measured in benchmarks/, never asserted here: these tests only check that
each CPU script's --quick mode runs in a fresh process, prints its Markdown table last and
writes consistent results, that the packing benchmark skips TRL cleanly when it cannot be
imported, that gpu.py's CPU-testable parts (arguments, checks, table, JSON, the no-CUDA
exit) work, and that gpu_check.py (``make gpu-check``) exits at once without CUDA, fits its
parts in 10 minutes, stops a part at its budget and gathers every part into one JSON, and that
reference_kernels.py (its part comparing packsim's reference kernels with the real ones) judges
each comparison, says what it compared with and reaches the known isolation verdicts on CPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"


def run_script(script: str, out: Path, *args: str) -> str:
    """Run ``benchmarks/<script> *args --out out`` in a fresh Python; return its stdout."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *args, "--out", str(out)],
        capture_output=True, text=True, timeout=180, cwd=ROOT, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def last_line_is_table(stdout: str) -> None:
    last = stdout.strip().splitlines()[-1]
    assert last.startswith("|") and last.endswith("|"), f"last line is not a table row: {last!r}"


@pytest.fixture(scope="module")
def bench():
    """Load a benchmark script as a module (``bench("gpu")``), benchmarks/ on sys.path meanwhile."""
    sys.path.insert(0, str(BENCH))

    def load(name: str):
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    yield load
    sys.path.remove(str(BENCH))


def test_packing_quick_runs_and_reports_every_packer(tmp_path):
    out = run_script("packing.py", tmp_path, "--quick", "--sizes", "2000", "--uniform-sizes", "500",
                     "--bimodal-sizes", "300", "--capacities", "512", "--repeats", "1")
    last_line_is_table(out)
    data = json.loads((tmp_path / "packing.json").read_text())
    rows = {(r["mix"], r["packer"]): r for r in data["rows"]}
    packers = {p for _, p in rows}
    assert {"wrapped", "ffd", "bfd", "bfd_split"} <= packers
    assert ("uniform", "bfd_split") not in rows  # uniform [1, 512]: nothing to split at 512
    wrapped = rows[("bimodal", "wrapped")]  # the bare-numpy references timed in the same rounds
    assert set(wrapped["numpy"]) == set(wrapped["ratio_vs_numpy"]) == {"cumsum", "write"}
    assert set(wrapped["lists"]["ratio_vs_numpy"]) == {"cumsum", "write"}
    assert all(len(ref["times"]) == wrapped["rounds"] for ref in wrapped["numpy"].values())
    assert isinstance(wrapped["load_1min"], float)
    bfd = rows[("long_tailed", "bfd")]
    assert bfd["packs"] >= bfd["lower_bound"] == -(-bfd["tokens"] // 512)
    assert bfd["fill"] == pytest.approx(bfd["tokens"] / (bfd["packs"] * 512))
    if "trl_bfd_1batch" in packers:  # both BFDs truncate to the capacity: same tokens placed
        assert rows[("long_tailed", "trl_bfd_1batch")]["tokens"] == bfd["tokens"]
        assert set(bfd["ratio_vs"]) == {"trl_bfd", "trl_bfd_1batch"}
        split = rows[("long_tailed", "bfd_split")]  # both split overlong examples: same tokens
        assert split["tokens"] == rows[("long_tailed", "trl_bfd_split_1batch")]["tokens"] > bfd["tokens"]
        targets = " ".join(t["target"] for t in data["targets"])
        for name in ("packsim wrapped at least as fast as trl_wrapped,",
                     "packsim wrapped 5x faster than trl_wrapped_1batch,",
                     "pack() lists (wrapped) at least as fast as trl_wrapped_1batch",
                     "packsim bfd_split faster than trl_bfd_split,"):
            assert name in targets


def test_packing_skips_trl_cleanly_when_it_does_not_import(bench, tmp_path, monkeypatch, capsys):
    packing = bench("packing")
    monkeypatch.setitem(sys.modules, "trl", None)  # `import trl` now raises ImportError
    assert packing.main(["--sizes", "500", "--uniform-sizes", "200", "--bimodal-sizes", "200", "--capacities", "512",
                         "--repeats", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "TRL columns skipped: TRL is not importable here" in out
    last_line_is_table(out)
    data = json.loads((tmp_path / "packing.json").read_text())
    assert {r["packer"] for r in data["rows"]} == {"wrapped", "ffd", "bfd", "bfd_split"}
    assert data["trl"].startswith("not run")


def test_packing_runs_only_the_packers_asked_for(bench, tmp_path, capsys):
    packing = bench("packing")
    assert packing.main(["--sizes", "300", "--uniform-sizes", "100", "--bimodal-sizes", "100", "--capacities", "256",
                         "--repeats", "1", "--packers", "wrapped,bfd", "--no-trl", "--out", str(tmp_path)]) == 0
    last_line_is_table(capsys.readouterr().out)
    data = json.loads((tmp_path / "packing.json").read_text())
    assert {r["packer"] for r in data["rows"]} == {"wrapped", "bfd"}
    assert {r["rounds"] for r in data["rows"]} == {3}  # small n: 2 x repeats + 1 rounds
    with pytest.raises(SystemExit):
        packing.parse_args(["--packers", "wrapped,nonsense"])


def test_packing_merge_keeps_the_rows_not_rerun_and_says_where_they_came_from(bench, tmp_path, capsys):
    packing = bench("packing")
    common = ["--sizes", "300", "--uniform-sizes", "100", "--bimodal-sizes", "100", "--capacities", "256", "--repeats", "1", "--no-trl",
              "--out", str(tmp_path)]
    assert packing.main([*common, "--packers", "wrapped,bfd"]) == 0
    first = json.loads((tmp_path / "packing.json").read_text())
    assert packing.main([*common, "--packers", "wrapped", "--merge"]) == 0
    capsys.readouterr()
    merged = json.loads((tmp_path / "packing.json").read_text())
    bfd = [r for r in merged["rows"] if r["packer"] == "bfd"]
    assert bfd == [r for r in first["rows"] if r["packer"] == "bfd"]  # kept as they were
    assert {r["packer"] for r in merged["rows"]} == {"wrapped", "bfd"}
    assert merged["merged_from"]["packers"] == ["bfd"]
    assert merged["merged_from"]["command"] == first["command"]


def test_attention_quick_runs_each_measurement_in_its_own_process(tmp_path):
    out = run_script("attention.py", tmp_path, "--quick", "--sizes", "128", "--paths", "blocked",
                     "--iters", "1")
    last_line_is_table(out)
    isolated = json.loads((tmp_path / "attention.json").read_text())
    assert isolated["isolated"] and isolated["rows"][0]["peak_mb"]["n"] == 1


def test_attention_rows_ratios_and_work_counts(bench, tmp_path, capsys):
    attention = bench("attention")
    assert attention.main(["--sizes", "256", "--paths", "dense,blocked,causal", "--iters", "1",
                           "--in-process", "--out", str(tmp_path)]) == 0
    last_line_is_table(capsys.readouterr().out)
    rows = {r["path"]: r for r in json.loads((tmp_path / "attention.json").read_text())["rows"]}
    assert set(rows) == {"dense", "blocked", "causal"}
    assert sum(rows["blocked"]["theory"].values()) > 0
    # score pairs: dense N^2 > causal N(N+1)/2 > per-example sum L_i(L_i+1)/2
    assert rows["dense"]["pairs"] == 256 * 256 > rows["causal"]["pairs"] > rows["blocked"]["pairs"]
    assert rows["blocked"]["fwd_bwd_vs_blocked"]["median"] == 1.0


def test_import_time_quick_counts_the_modules_import_packsim_loads(tmp_path):
    out = run_script("import_time.py", tmp_path, "--quick", "--no-reference")  # torch's own import: not ours
    last_line_is_table(out)
    data = json.loads((tmp_path / "import_time.json").read_text())
    rows = {r["measurement"]: r for r in data["rows"]}
    assert set(rows) == {"import packsim", "packsim --help", "python -c pass", "packsim compare --bogus",
                         "packsim train --bogus", "packsim audit --bogus"}  # a bad option: exit 2, timed
    pk = rows["import packsim"]
    assert pk["packsim_file"] == str(ROOT / "packsim" / "__init__.py")  # this checkout was measured
    assert pk["packsim_modules"] == len(pk["packsim_module_names"]) >= 1
    assert "packsim.core.model" not in pk["packsim_module_names"]  # the lazy API loads no model code
    assert all(r["seconds"]["n"] == 1 for r in data["rows"])  # --quick: one fresh process each
    bad = subprocess.run([sys.executable, str(BENCH / "import_time.py"), "--root", str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "no packsim/__init__.py there" in bad.stderr


def test_throughput_quick_runs_and_both_modes_compute_the_same_loss(tmp_path):
    out = run_script("throughput.py", tmp_path, "--quick", "--steps", "1", "--examples-per-step", "8",
                     "--padded-batch", "4", "--capacity", "512")
    last_line_is_table(out)
    s = json.loads((tmp_path / "throughput.json").read_text())["summary"]
    assert s["padded"]["real_tokens"] == s["packed"]["real_tokens"] > 0
    assert s["packed"]["all_tokens"] <= s["padded"]["all_tokens"] or s["padded"]["pad_fraction"] < 0.1
    # same init, same examples, correct setup vs one example per row: same loss
    assert s["step0_loss"]["abs_diff"] < 1e-4
    assert s["token_ratio"] == pytest.approx(s["token_ceilings"]["4"])


def test_audit_cost_quick_runs_and_records_the_audit_against_a_step(tmp_path):
    out = run_script("audit_cost.py", tmp_path, "--quick")
    last_line_is_table(out)
    payload = json.loads((tmp_path / "audit_cost.json").read_text())
    (run,) = payload["runs"]["after"]
    assert "error" not in run, run
    assert run["examples"] == 8 and run["batch_tokens"] > 0 and run["audit_failed"] == []
    assert run["audit_s"] > 0 and run["step_s"] > 0 and run["forward_tokens"] >= 2  # baseline + alone at least
    assert run["code"].startswith(str(ROOT))


def test_gpu_script_parts_work_without_cuda(bench, tmp_path, capsys):
    gpu = bench("gpu")
    args = gpu.parse_args(["--quick"])
    assert args.sizes == gpu.QUICK_SIZES and args.steps == 3 and args.paths == list(gpu.PATHS)
    with pytest.raises(SystemExit):
        gpu.parse_args(["--paths", "flash,nonsense"])
    lines = gpu.plan(args, gpu.kernel_availability())
    assert any(line.strip().startswith("flex") for line in lines)
    assert gpu.check_label("flash", {"out": 0.004, "dq": 0.01, "dk": 0.01, "dv": 0.01}) == "ok"
    assert gpu.check_label("flash", {"out": 0.004, "dq": 0.5, "dk": 0.01, "dv": 0.01}) == "FAIL"
    assert gpu.check_label("causal", {"out": 0.8, "dq": 0.8, "dk": 0.8, "dv": 0.8}).startswith("differs")
    rows = [{"n": 4096, "examples": 40, "path": "flash", "fwd_s": {"median": 0.001, "min": 0.001,
             "max": 0.002, "n": 3}, "peak_gib": 0.5, "rel_err": {"out": 0.004, "dq": 0.01, "dk": 0.01,
             "dv": 0.01}, "check": "ok"}]
    table = gpu.attention_table(rows)
    assert "| 4,096" in table and "flash" in table and "0.004" in table
    payload = gpu.build_payload(args, {"gpu": "test"}, {}, rows, None, [], 1.0, "cmd")
    assert json.loads(json.dumps(payload))["attention"][0]["path"] == "flash"
    if not torch.cuda.is_available():
        assert gpu.main(["--quick", "--out", str(tmp_path)]) == 0
        assert "CUDA is not available" in capsys.readouterr().out
        assert not (tmp_path / "gpu.json").exists()


def test_gpu_measurement_logic_on_cpu(bench, tmp_path, capsys):
    """The CUDA code path run on CPU at a tiny size: exact paths match the fp32 reference, the
    causal mask over the pack does not (it leaks across examples)."""
    assert bench("gpu").main(["--device", "cpu", "--sizes", "256", "--paths", "sdpa_dense,blocked,causal",
                            "--heads", "2", "--head-dim", "16", "--iters", "1", "--no-train",
                            "--out", str(tmp_path)]) == 0
    last_line_is_table(capsys.readouterr().out)
    rows = {r["path"]: r for r in json.loads((tmp_path / "gpu.json").read_text())["attention"]}
    assert rows["blocked"]["check"] == rows["sdpa_dense"]["check"] == "ok"
    assert rows["causal"]["check"].startswith("differs")
    assert rows["blocked"]["vs_fastest"]["path"] in {"blocked", "sdpa_dense"}


# ------------------------------------------------------------------------------ gpu_check.py


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the exit without CUDA")
def test_gpu_check_without_cuda_exits_at_once_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(BENCH / "gpu_check.py"), "--out", str(tmp_path / "out"),
                           "--work", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and "CUDA is not available" in lines[0] and "nothing was run" in lines[0]
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()


def test_gpu_check_plan_fits_ten_minutes_and_runs_every_part(bench, tmp_path, capsys):
    check = bench("gpu_check")
    args = check.parse_args([])
    assert args.parts == ["tests", "reference_kernels", "kernels", "compare"]
    assert sum(check.budgets(args).values()) <= 540  # + start-up: under 10 minutes
    cmds = check.part_commands(args, tmp_path)
    assert cmds["tests"][1:5] == ["-m", "pytest", "-m", "gpu"]
    assert "tests/test_attention.py" in cmds["tests"]  # the files holding GPU tests
    assert cmds["kernels"][1] == "benchmarks/gpu.py" and "4096,16384,65536" in cmds["kernels"]
    kernel_budget = float(cmds["kernels"][cmds["kernels"].index("--budget-s") + 1])
    assert kernel_budget < check.BUDGET_S["kernels"]  # gpu.py skips work before it is stopped
    assert cmds["compare"][1:5] == ["-m", "packsim", "compare", "--fast"]
    assert "cuda" in cmds["compare"]
    assert check.main(["--plan"]) == 0
    assert "540 s of budget" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        check.parse_args(["--parts", "tests,nonsense"])


def test_gpu_check_stops_a_part_at_its_budget_and_names_missing_modules(bench):
    check = bench("gpu_check")
    slow = check.run_part([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"],
                          1.0, "slow", dict(os.environ))
    assert slow["over_budget"] and slow["wall_s"] < 30 and slow["tail"] == ["started"]
    assert check.status_of(slow) == "over budget"
    missing = check.run_part([sys.executable, "-c", "import no_such_module_here"], 30, "m", dict(os.environ))
    assert check.status_of(missing) == "missing no_such_module_here"
    assert check.status_of({"over_budget": False, "returncode": 0, "tail": []}) == "ok"
    assert check.status_of({"over_budget": False, "returncode": 2, "tail": ["boom"]}) == "failed (exit 2)"


def test_gpu_check_reads_each_parts_results(bench, tmp_path):
    check = bench("gpu_check")
    (tmp_path / "t.xml").write_text(
        '<testsuites><testsuite tests="5" failures="1" errors="0" skipped="2">'
        '<testcase classname="tests.test_attention" name="test_a"><failure/></testcase>'
        '<testcase classname="tests.test_model" name="test_b"/></testsuite></testsuites>')
    counts = check.junit_counts(tmp_path / "t.xml")
    assert (counts["passed"], counts["failed"], counts["skipped"]) == (2, 1, 2)
    assert counts["failures"] == ["tests.test_attention::test_a"]
    assert check.junit_counts(tmp_path / "missing.xml") is None
    spread = {"median": 0.012, "min": 0.011, "max": 0.013, "n": 5}
    gpu = {"attention": [{"n": 4096, "path": "flash", "check": "ok", "fwd_bwd_s": spread},
                         {"n": 65536, "path": "flash", "check": "ok", "fwd_bwd_s": spread},
                         {"n": 65536, "path": "sdpa_dense", "check": "error"}],
           "training": {"ratio": {"median": 2.2, "min": 2.1, "max": 2.4, "n": 4},
                        "padded": {"pad_fraction": 0.6, "real_tokens_per_s": 1e5},
                        "packed": {"pad_fraction": 0.04, "real_tokens_per_s": 2.2e5}},
           "complete": False}
    kernels = check.kernel_summary(gpu)
    assert "N=65,536: flash 12" in kernels and "error 1, ok 2" in kernels and "incomplete" in kernels
    assert "2.2 [2.1-2.4]" in check.training_summary(gpu)
    results = {"runs": [{"setup": "buggy", "final": {"isolated_exact_match": 0.15, "reported_loss": 0.25}},
                        {"setup": "correct", "final": {"isolated_exact_match": 0.5, "reported_loss": 0.43}}]}
    assert check.compare_summary(results) == ("buggy: isolated exact match 0.15, reported loss 0.25; "
                                              "correct: isolated exact match 0.5, reported loss 0.43")
    table = check.summary_table([{"status": "ok", "wall_s": 40.2, "budget_s": 75, "lines": [("tests", "3 passed")]}])
    assert table.splitlines()[-1].startswith("| tests") and "40 / 75" in table


def test_gpu_check_logic_on_cpu_writes_one_json(bench, tmp_path, capsys):
    """The orchestration with the kernels part run on CPU at a tiny size (not GPU numbers)."""
    check = bench("gpu_check")
    assert check.main(["--device", "cpu", "--parts", "kernels", "--out", str(tmp_path),
                       "--work", str(tmp_path / "work")]) == 0
    last_line_is_table(capsys.readouterr().out)
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    assert data["complete"] and [p["part"] for p in data["parts"]] == ["kernels"]
    part = data["parts"][0]
    assert part["status"] == "ok" and part["returncode"] == 0
    assert {r["path"] for r in part["gpu"]["attention"]} == {"sdpa_dense", "blocked", "causal"}


def test_packing_runs_only_the_mixes_asked_for_on_the_cpu_clock(bench, tmp_path, capsys):
    packing = bench("packing")
    assert packing.main(["--mixes", "bimodal", "--bimodal-sizes", "300", "--capacities", "256", "--repeats", "1",
                         "--packers", "wrapped", "--no-trl", "--clock", "cpu", "--out", str(tmp_path)]) == 0
    last_line_is_table(capsys.readouterr().out)
    data = json.loads((tmp_path / "packing.json").read_text())
    assert {(r["mix"], r["packer"]) for r in data["rows"]} == {("bimodal", "wrapped")} and data["clock"] == "cpu"
    lengths = packing.make_lengths("bimodal", 20_000)  # the mix: 2..4096, a quarter long
    assert lengths.min() >= 2 and lengths.max() <= 4096 and 0.15 < (lengths > 400).mean() < 0.3


def test_from_examples_times_both_builders_and_checks_they_agree(bench, tmp_path, capsys):
    from_examples = bench("from_examples")
    assert from_examples.main(["--n", "200", "--capacity", "128", "--repeats", "1", "--out", str(tmp_path)]) == 0
    last_line_is_table(capsys.readouterr().out)
    data = json.loads((tmp_path / "from_examples.json").read_text())
    assert [r["strategy"] for r in data["rows"]] == ["bfd", "wrapped"] and data["n_examples"] == 200
    assert all(len(r["arrays"]["times"]) == len(r["loop"]["times"]) == 1 for r in data["rows"])


def test_gate_time_quick_times_the_gate_and_records_what_it_imported(tmp_path):
    out = run_script("gate_time.py", tmp_path, "--quick", "--paths", "--collator flattening")
    last_line_is_table(out)
    rows = json.loads((tmp_path / "gate_time.json").read_text())["rows"]
    assert [(r["path"], r["checkout"]) for r in rows] == [("--collator flattening", "after")]
    row = rows[0]
    assert row["rc"] == 0 and row["verdict"] == "pre-flight PASS" and row["modules"] > 100
    assert row["trl"] is False  # the flattening collator needs no TRL


# ------------------------------------------------------------------------------ reference_kernels.py


def test_reference_kernels_judges_each_comparison_and_says_what_it_was_made_against(bench, tmp_path, monkeypatch,
                                                                                     capsys):
    """The logic the GPU run relies on, on CPU: a real kernel that differs is caught, one that raises is
    not counted, the flash rule's masks are flash-attn's, and nothing is claimed as a real comparison."""
    rk = bench("reference_kernels")
    assert rk.parse_args([]).sections == list(rk.SECTIONS) and rk.parse_args([]).dtypes == list(rk.DTYPES)
    if not torch.cuda.is_available():
        assert rk.main(["--out", str(tmp_path / "none")]) == 0
        assert "CUDA is not available" in capsys.readouterr().out and not (tmp_path / "none").exists()
    assert rk.real_kernels("conv", torch.device("cpu")) == (None, "causal-conv1d runs on CUDA only (this run is on cpu)")
    # flash-attn 2's rule, written out: causal aligned bottom-right (q 2 tokens, k 4), a (1, 0) window
    assert rk._visible(2, 4, True, (-1, -1), "cpu").tolist() == [[True, True, True, False], [True] * 4]
    assert rk._visible(2, 4, True, (1, 0), "cpu").tolist() == [[False, True, True, False], [False, False, True, True]]
    window = next(c for c in rk.flash_cases(rk.SIZES[True]) if "window" in c["name"])
    x = rk.cast(window["make"](torch.Generator().manual_seed(0)), torch.float32, "cpu")
    assert rk.errors(window["call"](rk.references()["flash_attn_varlen_func"], x), window["torch"](x))["max_rel"] < 1e-5
    no_window = rk.flash_cases(rk.SIZES[True])[0]["torch"](x)  # the same inputs, plain causal
    assert rk.errors(window["call"](rk.references()["flash_attn_varlen_func"], x), no_window)["max_rel"] > 0.1
    # a stand-in "real" package: a conv that ignores seq_idx (differs), an update that raises (not compared)
    ref = rk.references()

    def leaky(x, weight, bias=None, seq_idx=None, activation=None):
        return ref["causal_conv1d_fn"](x, weight, bias, activation=activation)

    def refuses(*args, **kwargs):
        raise RuntimeError("no such dtype")

    monkeypatch.setattr(rk, "real_kernels", lambda section, device: (
        {"causal_conv1d_fn": leaky, "causal_conv1d_update": refuses}, "causal-conv1d 0.0 (a stand-in)"))
    args = rk.parse_args(["--device", "cpu", "--tiny"])
    section = rk.run_kernel_section("conv", ["float32"], args, torch.device("cpu"), float("inf"), [])
    checks = {r["case"]: r["check"] for r in section["rows"]}
    assert checks["seq_idx, 2 packed rows, silu"] == "differs" and checks["no seq_idx, silu"] == "ok"
    assert checks["one decode step (out, state)"].startswith("not compared: it raised RuntimeError")
    assert all(r["against"] == "causal-conv1d 0.0 (a stand-in) (the real kernel)" for r in section["rows"])
    bad = rk.problems({"sections": {"conv": section}, "verdicts": []})
    assert len(bad) == 1 and "seq_idx, 2 packed rows" in bad[0]
    verdicts = bench("reference_verdicts")
    assert verdicts._verdict_row("m", "k", "bfloat16", "c", "isolates", 0.26)["check"] == "UNEXPECTED"
    assert verdicts._verdict_row("m", "k", "float32", "c", "leaks", 0.26)["verdict"] == "leaks"
    assert verdicts._verdict_row("m", "k", "float32", "c", "isolates", 1e-3)["verdict"] == "unclear"


def test_gpu_check_reference_kernels_part_on_cpu(bench, tmp_path, capsys):
    """The part as make gpu-check runs it, on CPU at tiny sizes (not GPU numbers): every kernel compared
    with a torch path and saying so, and the known verdicts (one row isolates, two rows leak, cu_seq_lens
    fix them; Bamba leaks without seq_idx and isolates with it)."""
    check = bench("gpu_check")
    cmd = check.part_commands(check.parse_args([]), tmp_path)["reference_kernels"]
    assert cmd[1] == "benchmarks/reference_kernels.py" and float(cmd[cmd.index("--budget-s") + 1]) < 90
    assert check.main(["--device", "cpu", "--parts", "reference_kernels", "--out", str(tmp_path),
                       "--work", str(tmp_path / "work")]) == 0
    last_line_is_table(capsys.readouterr().out)
    part = json.loads((tmp_path / "gpu_check.json").read_text())["parts"][0]
    assert part["status"] == "ok" and part["reference"]["complete"] and not part["reference"]["skipped"]
    rows = [r for s in part["reference"]["sections"].values() for r in s["rows"]]
    assert {r["kernel"] for r in rows} == set().union(*(names for _, names in bench("reference_kernels").KERNELS.values()))
    assert all(r["check"] == "ok" and "runs on CUDA only" in r["against"] and r["against"].endswith("instead")
               for r in rows)
    assert {r["dtype"] for r in rows if r["kernel"].startswith("flash")} == {"bfloat16"}  # flash-attn: no fp32
    verdicts = {(r["model"].split()[0], r["dtype"], r["condition"]): r["verdict"] for r in part["reference"]["verdicts"]}
    assert verdicts[("llama", "float32", "two rows, position_ids restart, no cu_seq_lens")] == "leaks"
    assert verdicts[("llama", "bfloat16", "two rows + cu_seq_lens_q/k (the fix)")] == "isolates"
    assert verdicts[("bamba", "bfloat16", "position_ids only")] == "leaks"
    assert verdicts[("bamba", "float32", "seq_idx, train mode (the fused kernel)")] == "isolates"
    assert all(r["check"] == "as expected" for r in part["reference"]["verdicts"]) and len(verdicts) == 12
    kernels, judged = (line for _, line in part["lines"])
    assert "conv [causal-conv1d runs on CUDA only (this run is on cpu)]: ok 6" in kernels
    assert judged == "bamba 6 as expected, llama 6 as expected"


def test_pack_inputs_times_every_input_kind_and_checks_their_packs_agree(bench, tmp_path, capsys):
    pack_inputs = bench("pack_inputs")
    assert pack_inputs.main(["--n", "300", "--capacities", "64", "--repeats", "1", "--mixes", "bimodal",
                             "--no-trl", "--out", str(tmp_path)]) == 0
    last_line_is_table(capsys.readouterr().out)
    rows = json.loads((tmp_path / "pack_inputs.json").read_text())["rows"]
    assert {r["input"] for r in rows} == {*pack_inputs.KINDS, "list (before)", "numpy"}
    assert {r["call"] for r in rows if r["input"] == "list"} == {"pack_arrays", "pack() lists"}
    assert all(len(r["times"]) == 1 and r["x_faster_than_trl_1batch"] is None for r in rows)  # no TRL: no ratio


def test_random_audits_quick_agrees_with_its_ground_truth_and_the_truth_can_see_each_fault(tmp_path, bench):
    """--quick audits random cells (family x path x fault x evidence) and records each seed; every
    fault is bad by the script's own ground truth (so agreement is not a pass-everything), and a
    quick run agrees on all of them."""
    import random

    ra = bench("random_audits")
    rng = random.Random(0)
    for fault in ra.FAULTS:  # the ground truth alone, on one batch per fault
        exs = ra.examples(rng)
        batch = ra.batch_with_fault(exs, fault)
        truth = ra.truth(ra.tiny_model("llama", "flash"), exs, batch, random.Random(1))
        assert truth["bad"] == (fault != "none"), (fault, truth)
    out = run_script("random_audits.py", tmp_path, "--quick", "--cells", "12")
    last_line_is_table(out)
    rows = json.loads((tmp_path / "random_audits.json").read_text())["rows"]
    assert len(rows) == 12 and all(r["check"] == "agrees" for r in rows), [r for r in rows if r["check"] != "agrees"]
    assert len({r["seed"] for r in rows}) == 12


def test_random_hybrid_audits_quick_agrees_and_its_float64_truth_sees_each_fault(tmp_path, bench):
    """Every fault is bad by the script's own float64 truth on a family its fields isolate (so agreement is
    not a pass-everything), a clean isolating row moves the others by exactly 0 there, and a quick run agrees."""
    import copy
    import random

    from packsim.exhibits.hybrid_traps import build_frontier
    from packsim.reference.hybrid_emulation import emulate_hybrid_kernels

    rha = bench("random_hybrid_audits")
    model = copy.deepcopy(build_frontier("bamba", "sdpa")).double().eval()
    with emulate_hybrid_kernels():
        for fault in rha.FAULTS:
            exs = rha.examples(random.Random(3))[:3]
            batch = rha.hybrid_batch(exs, "seq_idx", fault)
            batch = {k: v.double() if v.is_floating_point() else v for k, v in batch.items()}
            truth = rha.truth(model, exs, batch, random.Random(1), rha.LEAK_TOL, rha.ALONE_TOL, use_cache=False)
            assert truth["bad"] == (fault != "none"), (fault, truth)
            if fault == "none":
                assert truth["leak"] == 0.0 and truth["alone_gap"] < 1e-6, truth
    out = run_script("random_hybrid_audits.py", tmp_path, "--quick", "--cells", "12")
    last_line_is_table(out)
    rows = json.loads((tmp_path / "random_hybrid_audits.json").read_text())["rows"]
    assert len(rows) == 12 and all(r["check"] == "agrees" for r in rows), [r for r in rows if r["check"] != "agrees"]


def test_random_cp_audits_quick_agrees_and_its_truth_sees_both_traps(tmp_path, bench):
    """Under accelerate's hook a packed row leaks and a left-padded row reads its padding, by the script's own
    truth (a right-padded row does neither), and a quick run has no false verdict."""
    import random

    rcp = bench("random_cp_audits")
    exs = [([1, 5, 6, 7, 2], 2), ([1, 8, 9, 10, 11, 2], 3)]
    for collator, bad in (("packed", True), ("right_padded", False), ("left_padded", True)):
        trainer = rcp.build_trainer("llama", collator, exs, str(tmp_path / collator))
        batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
        assert rcp.truth(trainer.model, batch, True, random.Random(0))["bad"] == bad, collator
        assert not rcp.truth(trainer.model, batch, False, random.Random(0))["bad"], collator  # the mask honoured
    out = run_script("random_cp_audits.py", tmp_path, "--quick", "--cells", "8", "--sizes", "2", "3")
    last_line_is_table(out)
    rows = json.loads((tmp_path / "random_cp_audits.json").read_text())["rows"]
    assert len(rows) == 8 and all(r["check"] == "agrees" for r in rows), [r for r in rows if r["check"] != "agrees"]
