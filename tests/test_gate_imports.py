"""What the gate imports: only what the chosen path's verdict needs (issue 33 item 2).

Each gate runs in a fresh subprocess (``python -m packsim audit ...`` through runpy) that prints,
at exit, which of TRL, ``datasets`` and its pyarrow / pandas are in ``sys.modules``: the
``flattening`` and ``packsim`` collators and a ``--trainer`` factory on a plain list need none of
them (transformers' Trainer imports ``datasets`` at import time; packsim.core.trainer_import keeps it
out); a TRL collator does import TRL. The stand-in that keeps ``datasets`` out is checked to
recognise a real ``datasets.Dataset`` once that module is loaded. Times are the benchmark's
(benchmarks/gate_time.py), never a test's.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pipelines import PAIRS, save_tiny_checkpoint

HEAVY = ("trl", "datasets", "pyarrow", "pandas")

# run the command line as `python -m packsim` does, then report the heavy modules loaded
RUN = ("import json, runpy, sys\nsys.argv = ['packsim'] + sys.argv[1:]\ncode = 0\ntry:\n"
       "    runpy.run_module('packsim', run_name='__main__')\nexcept SystemExit as e:\n    code = e.code\n"
       f"print(json.dumps({{'rc': code, 'loaded': [m for m in {HEAVY!r} if m in sys.modules]}}))")

FACTORY = '''
from transformers import AutoModelForCausalLM, AutoTokenizer, DataCollatorWithFlattening, Trainer, TrainingArguments

def make_trainer():
    tok = AutoTokenizer.from_pretrained({ckpt!r})
    features = [{{"input_ids": tok(p + c)["input_ids"], "labels": tok(p + c)["input_ids"]}} for p, c in {pairs!r}]
    args = TrainingArguments(output_dir={out!r}, per_device_train_batch_size=4, max_steps=1, report_to="none",
                             save_strategy="no", use_cpu=True, seed=0)
    return Trainer(model=AutoModelForCausalLM.from_pretrained({ckpt!r}), args=args, train_dataset=features,
                   data_collator=DataCollatorWithFlattening())
'''


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("gate-imports")
    save_tiny_checkpoint(root / "ckpt")
    (root / "data.jsonl").write_text("".join(json.dumps({"prompt": p, "completion": c}) + "\n" for p, c in PAIRS))
    (root / "factory.py").write_text(FACTORY.format(ckpt=str(root / "ckpt"), pairs=PAIRS, out=str(root / "out")))
    return root


def gate(*argv: str) -> tuple[dict, str]:
    """(the exit code and heavy modules loaded, stdout) of one fresh ``packsim`` process."""
    env_code = "import os; os.environ['OMP_NUM_THREADS'] = '1'\n"
    out = subprocess.run([sys.executable, "-c", env_code + RUN, *argv], capture_output=True, text=True, timeout=600)
    lines = out.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("{"), out.stderr[-2000:]
    return json.loads(lines[-1]), "\n".join(lines[:-1])


@pytest.mark.slow
def test_a_flattening_gate_imports_neither_trl_nor_datasets(files):
    got, out = gate("audit", "--model", str(files / "ckpt"), "--data", str(files / "data.jsonl"),
                    "--collator", "flattening")
    assert got == {"rc": 0, "loaded": []}, (got, out[-2000:])
    assert out.rstrip().endswith("pre-flight PASS")


@pytest.mark.slow
def test_a_trainer_factory_on_a_list_imports_neither(files):
    got, out = gate("audit", "--trainer", f"{files / 'factory.py'}:make_trainer")
    assert got["loaded"] == [], (got, out[-2000:])
    assert got["rc"] in (0, 1, 3) and "=== audit of the trainer from" in out  # a verdict, not a crash (4) or bad input (2)


@pytest.mark.slow
def test_a_trl_collator_imports_trl(files):
    pytest.importorskip("trl")
    got, out = gate("audit", "--model", str(files / "ckpt"), "--data", str(files / "data.jsonl"),
                    "--collator", "trl-bfd")
    assert got["rc"] == 0 and "trl" in got["loaded"] and "datasets" in got["loaded"], (got, out[-2000:])


def test_the_stand_in_recognises_a_real_dataset_once_loaded():
    pytest.importorskip("datasets")
    code = (
        "import sys\nfrom packsim.core.trainer_import import import_trainer\n"
        "trainer = import_trainer()\n"
        "print('datasets' in sys.modules, trainer.is_datasets_available(), isinstance([], trainer.datasets.Dataset))\n"
        "import datasets\n"
        "ds = datasets.Dataset.from_list([{'input_ids': [1, 2]}])\n"
        "print(trainer.datasets.Dataset is datasets.Dataset, isinstance(ds, trainer.datasets.Dataset),\n"
        "      trainer.datasets.__version__ == datasets.__version__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["False", "True", "False", "True", "True", "True"], out.stderr[-2000:]
