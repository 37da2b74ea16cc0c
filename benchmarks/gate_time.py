"""Benchmark: the gate's time to its verdict, and what it imports, per path.

Each measurement is one fresh ``python -X importtime -m packsim audit ...`` process, from start to
exit (the verdict is printed last), on a tiny checkpoint and JSONL data made here:

- ``--collator flattening`` (transformers' ``DataCollatorWithFlattening``: no TRL needed);
- ``--collator trl-bfd`` (TRL's ``SFTTrainer`` with BFD packing: TRL needed);
- ``--trainer FILE.py:make_trainer`` (a plain transformers ``Trainer`` factory written here);
- ``python -c "import torch, transformers"``: the floor any fine-tuning script pays anyway.

Per path: wall seconds (median and min-max over ``--repeats`` interleaved rounds), the modules
imported, and whether ``trl`` and ``datasets`` were among them. ``--before DIR`` measures an older
checkout side by side, round by round (``PYTHONPATH=DIR``; e.g. ``git worktree add /tmp/before
d755348``), and the table gives before / after per path.

    python benchmarks/gate_time.py --before /tmp/before --label-before d755348
    python benchmarks/gate_time.py --quick          # 1 round -> runs/bench-quick/
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchutil as bu

ROOT = Path(__file__).resolve().parents[1]

FACTORY = '''
from transformers import AutoModelForCausalLM, DataCollatorWithFlattening, Trainer, TrainingArguments

def make_trainer():
    import json
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained({ckpt!r})
    rows = [json.loads(line) for line in open({data!r})]
    features = [{{"input_ids": tok(r["prompt"] + r["completion"])["input_ids"]}} for r in rows]
    for f in features:
        f["labels"] = list(f["input_ids"])
    args = TrainingArguments(output_dir={out!r}, per_device_train_batch_size=4, max_steps=1, report_to="none",
                             save_strategy="no", use_cpu=True, seed=0)
    return Trainer(model=AutoModelForCausalLM.from_pretrained({ckpt!r}, attn_implementation="sdpa"), args=args,
                   train_dataset=features, data_collator=DataCollatorWithFlattening())
'''

PAIRS = [("abc=", "cba"), ("hello=", "olleh"), ("packs=", "skcap"), ("tiny=", "ynit"),
         ("rows=", "swor"), ("mask=", "ksam"), ("loss=", "ssol"), ("seq=", "qes")]


def make_inputs(tmp: Path) -> dict[str, list[str]]:
    """The checkpoint, data and factory the paths run on -> path name -> argv after ``python``."""
    sys.path.insert(0, str(ROOT))
    from packsim.core.model import build_model
    from packsim.core.tokenizer import build_tokenizer

    ckpt, data = tmp / "ckpt", tmp / "data.jsonl"
    build_model("tiny", attn_implementation="sdpa", seed=0).save_pretrained(ckpt)
    build_tokenizer().save_pretrained(ckpt)
    data.write_text("".join(json.dumps({"prompt": p, "completion": c}) + "\n" for p, c in PAIRS))
    factory = tmp / "train_factory.py"
    factory.write_text(FACTORY.format(ckpt=str(ckpt), data=str(data), out=str(tmp / "out")))
    gate = ["-X", "importtime", "-m", "packsim", "audit", "--model", str(ckpt), "--data", str(data)]
    return {"--collator flattening": gate + ["--collator", "flattening"],
            "--collator trl-bfd": gate + ["--collator", "trl-bfd"],
            "--trainer": ["-X", "importtime", "-m", "packsim", "audit", "--trainer", f"{factory}:make_trainer"],
            "import torch, transformers": ["-X", "importtime", "-c", "import torch, transformers"]}


def run_once(argv: list[str], root: Path, cwd: Path) -> dict:
    """One fresh process: wall seconds, exit code, the modules it imported (from -X importtime)."""
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, cwd=cwd, timeout=600)
    wall = time.perf_counter() - t0
    mods = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    mods.discard("package")  # the header line
    tops = {m.split(".")[0] for m in mods}
    return {"s": wall, "rc": proc.returncode, "modules": len(mods), "trl": "trl" in tops,
            "datasets": "datasets" in tops, "verdict": (proc.stdout.strip().splitlines() or [""])[-1][:80]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds per path (median, min-max)")
    ap.add_argument("--quick", action="store_true", help="one round, results to runs/bench-quick/")
    ap.add_argument("--before", metavar="DIR", help="an older checkout measured side by side")
    ap.add_argument("--label-before", default="before", help="what to call it in the table")
    ap.add_argument("--paths", default="", help="comma-separated subset of the paths (default: all)")
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    args = ap.parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    roots = {"after": ROOT} | ({args.label_before: Path(args.before).resolve()} if args.before else {})
    with tempfile.TemporaryDirectory(prefix="packsim-gate-time-") as tmp:
        inputs = make_inputs(Path(tmp))
        names = [p for p in inputs if not args.paths or p in args.paths.split(",")]
        runs: dict[str, dict[str, list[dict]]] = {n: {r: [] for r in roots} for n in names}
        for _ in range(repeats):  # interleaved: each round runs every path on every checkout
            for name in names:
                for label, root in roots.items():
                    runs[name][label].append(run_once(inputs[name], root, Path(tmp)))
    rows, table = [], []
    for name in names:
        for label in roots:
            got = runs[name][label]
            s = bu.summarize([g["s"] for g in got])
            last = got[-1]
            rows.append({"path": name, "checkout": label, "s": s, **{k: last[k] for k in
                                                                    ("rc", "modules", "trl", "datasets", "verdict")}})
            table.append([name, label, bu.fmt_spread(s), str(last["rc"]), str(last["modules"]),
                          "yes" if last["trl"] else "no", "yes" if last["datasets"] else "no"])
    out = bu.out_dir(args.out, args.quick)
    bu.save_json(out / "gate_time.json", {"machine": bu.machine_info(threads=1), "command": sys.argv,
                                          "repeats": repeats, "rows": rows})
    print(bu.markdown_table(["path", "checkout", "wall s (median [min-max])", "exit", "modules", "trl", "datasets"],
                            table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
