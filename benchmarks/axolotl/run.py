"""Audit Axolotl's sample packing live with packsim, against a ground truth computed without packsim.

Run it in the venv that setup.sh builds (axolotl 0.19.0 and its pins, CPU torch):

    bash benchmarks/axolotl/setup.sh
    .venv-axolotl/bin/python benchmarks/axolotl/run.py            # every pipeline
    .venv-axolotl/bin/python benchmarks/axolotl/run.py sdpa eager # some

It builds everything in a temp dir (a tiny Llama saved with save_pretrained, packsim's character
tokenizer saved Llama-style, a 16-example alpaca JSONL) and, for each pipeline (a YAML config
beside this file on top of base.yml), runs what ``axolotl train config.yml`` runs, in a process of
its own (Axolotl's patches are process-global):

    cfg = axolotl.cli.config.load_cfg(yml)                          # validate + normalize
    meta = axolotl.common.datasets.load_datasets(cfg=cfg)           # tokenize, drop, position_ids
    trainer, model, tok, _, _ = axolotl.train.setup_model_and_trainer(cfg, meta)
    axolotl.train.execute_training(cfg, trainer, None)              # the AuditCallback row, 1 step

and audits (a) the batches of the trainer's own train dataloader (MultipackBatchSampler +
V2BatchSamplerDataCollatorForSeq2Seq) and (b) the trainer, with packsim.audit, audit_trainer and
AuditCallback. The ground truth uses no packsim: for every example of every packed row of every
batch of one epoch, its tokens are replaced and the max |change| of every OTHER example's logits
through the model's own forward is taken (> 1e-5 in fp32 = leaks); the labels are classed by role
from the tokens (BOS starts an example, the response starts after "### Response:\n").

Prints the table "pipeline | entry point | packsim verdict | ground truth | agree" and writes
results/axolotl/axolotl_live.json and results/axolotl/table.md. No download at run time.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RESULTS = ROOT / "results" / "axolotl"

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
    "AXOLOTL_DO_NOT_TRACK": "1", "DO_NOT_TRACK": "1", "WANDB_MODE": "disabled", "WANDB_DISABLED": "true",
    "HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "ACCELERATE_USE_CPU": "1",
    "PACKSIM_NO_WINDOW_WARNING": "1",
}

# pipeline name -> (yml, how the flash kernel is served on this CPU: None (no flash), REQUESTS
# (packsim.reference.flash_emulation.reference_for_flash_requests(), what `packsim audit --trainer` does:
# a model that asks for flash_attention_2 at load runs transformers' flash path on packsim's
# reference kernel) or a kernel name that run.py's ModelLoader shim serves with packsim.emulate_flash())
REQUESTS = "reference_for_flash_requests"
PIPELINES = {
    "sdpa": ("sdpa.yml", None),
    "eager": ("eager.yml", None),
    "sdpa_train_on_inputs": ("sdpa_train_on_inputs.yml", None),
    "flash_attention_2": ("flash_attention_2.yml", REQUESTS),
    "hub_kernel_flash": ("hub_kernel_flash.yml", "kernels-community/vllm-flash-attn3"),
    "sdpa_eos_tokenizer": ("sdpa_eos_tokenizer.yml", None),
    "flash_attention_2_no_pad": ("flash_attention_2_no_pad.yml", REQUESTS),
    "flex_attention": ("flex_attention.yml", None),
}
DEFAULT = [p for p in PIPELINES if p != "flex_attention"]  # flex: opt-in (slow on CPU, forward only)
GATE_DEFAULT = ["sdpa", "flash_attention_2", "hub_kernel_flash"]  # the CLI gate rows (~25 s each)
ENTRY_POINTS = ("audit(model, batch)", "audit(model, batch, examples, response_mask)",
                "audit_trainer(trainer)", "AuditCallback (1 step)", "packsim audit --trainer (CLI gate)")
GATE = "python -m packsim audit --trainer benchmarks/axolotl/run.py:make_trainer"
TOL = 1e-5
N_EXAMPLES = 16
CHILD_TIMEOUT_S = 420


# ----------------------------------------------------------------------------------------------
# the temp dir: model, tokenizers, data (no download)

def build_work(work: Path) -> dict:
    import torch
    from tokenizers import processors
    from transformers import LlamaConfig, LlamaForCausalLM

    from packsim.core.tokenizer import build_tokenizer

    tok_eos = build_tokenizer()  # packsim's tokenizer: <bos> text <eos>
    tok_eos.save_pretrained(work / "tokenizer_eos")
    tok = build_tokenizer()  # Llama-style: <bos> text (EOS added by Axolotl after the response)
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{tok.bos_token} $A", pair=f"{tok.bos_token} $A $B",
        special_tokens=[(tok.bos_token, tok.bos_token_id)])
    tok.save_pretrained(work / "tokenizer")
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, tie_word_embeddings=False, attention_dropout=0.0)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(work / "model")
    rng = random.Random(0)
    rows = []
    for _ in range(N_EXAMPLES):  # responses of different lengths, so the packs are uneven
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        words = rng.choice(["", "well, ", "so "])
        rows.append({"instruction": f"add {a} and {b}", "input": "", "output": f"{words}the sum is {a + b}"})
    with open(work / "train.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return {"examples": len(rows), "model": "LlamaForCausalLM hidden 64, 2 layers, 4 heads (2 kv), vocab "
            f"{len(tok)}", "params": sum(p.numel() for p in LlamaForCausalLM(config).parameters())}


def write_yaml(work: Path, pipeline: str) -> Path:
    import yaml

    yml, _ = PIPELINES[pipeline]
    merged = {}
    for part in ((HERE / "base.yml").read_text(), (HERE / yml).read_text()):
        merged.update(yaml.safe_load(part.replace("{WORK}", str(work)).replace("{PIPELINE}", pipeline)) or {})
    out = work / pipeline / "config.yml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(merged, sort_keys=False))
    return out


# ----------------------------------------------------------------------------------------------
# the ground truth, without packsim

def _segments(ids_row, labels_row, tok) -> list[tuple[int, int]]:
    """Examples in one packed row: each starts at a BOS; the row's tail of pad tokens after the last
    example (label -100) is padding. Independent of position_ids / attention_mask."""
    ids = ids_row.tolist()
    labels = labels_row.tolist()
    end = len(ids)
    while end > 0 and ids[end - 1] == tok.pad_token_id and labels[end - 1] == -100:
        end -= 1
    starts = [t for t in range(end) if ids[t] == tok.bos_token_id]
    return [(s, e) for s, e in zip(starts, starts[1:] + [end], strict=True)]


def _response_start(ids: list[int], tok) -> int:
    """First response token: after the last "esponse:" (the character tokenizer maps 'R', '#' and
    newline to <unk>), the newline token after it, and the EOS a tokenizer that appends one put at
    the end of the prompt (Axolotl's alpaca strategy tokenizes the prompt alone and keeps it)."""
    marker = tok("esponse:", add_special_tokens=False)["input_ids"]
    last = max(i for i in range(len(ids) - len(marker) + 1) if ids[i:i + len(marker)] == marker)
    start = last + len(marker) + 1
    while start < len(ids) - 1 and ids[start] == tok.eos_token_id:
        start += 1
    return start


def forward_fields(batch: dict) -> dict:
    return {k: v for k, v in batch.items() if k != "labels"}


def ground_truth(model, batches: list[dict], tok) -> dict:
    """Perturb each example of each packed row, measure the other examples' logits; class the labels."""
    import torch

    was = model.training
    model.eval()
    worst, worst_pair, pairs, leaking, n_ex = 0.0, None, 0, 0, 0
    roles = {"prompt_counted": 0, "prompt_total": 0, "response_counted": 0, "response_total": 0,
             "boundary_counted": 0, "boundary_total": 0, "padding_counted": 0, "padding_total": 0,
             "wrong_value": 0}
    gen = torch.Generator().manual_seed(0)
    seg_lists = []
    try:
        for b, batch in enumerate(batches):
            fields = forward_fields(batch)
            ids, labels = batch["input_ids"], batch["labels"]
            with torch.no_grad():
                base = model(**fields, use_cache=False).logits.float()
            segs = [_segments(ids[r], labels[r], tok) for r in range(ids.shape[0])]
            seg_lists.append(segs)
            real = torch.zeros(ids.shape, dtype=torch.bool)
            for r, row in enumerate(segs):
                for s, e in row:
                    real[r, s:e] = True
            # labels by role
            for r, row in enumerate(segs):
                lab, tid = labels[r].tolist(), ids[r].tolist()
                for s, e in row:
                    n_ex += 1
                    rs = s + _response_start(tid[s:e], tok)
                    for t in range(s, e):
                        counted = lab[t] != -100
                        if counted and lab[t] != tid[t]:
                            roles["wrong_value"] += 1
                        if t == s and s > 0:  # predicted from the previous example's last token
                            roles["boundary_total"] += 1
                            roles["boundary_counted"] += counted
                        elif t < rs:
                            roles["prompt_total"] += 1
                            roles["prompt_counted"] += counted
                        else:
                            roles["response_total"] += 1
                            roles["response_counted"] += counted
                pad = [t for t in range(len(tid)) if not real[r, t]]
                roles["padding_total"] += len(pad)
                roles["padding_counted"] += sum(lab[t] != -100 for t in pad)
            # isolation: change example i's tokens, watch every other example's logits
            for r, row in enumerate(segs):
                for i, (s, e) in enumerate(row):
                    pert = ids.clone()
                    n = e - s
                    new = torch.randint(4, len(tok), (n,), generator=gen)
                    same = new == ids[r, s:e]
                    new[same] = (new[same] - 4 + 1) % (len(tok) - 4) + 4
                    pert[r, s:e] = new
                    with torch.no_grad():
                        out = model(**{**fields, "input_ids": pert}, use_cache=False).logits.float()
                    others = real.clone()
                    others[r, s:e] = False
                    change = (out - base).abs().amax(-1)[others]
                    m = float(change.max()) if change.numel() else 0.0
                    for j, (s2, e2) in enumerate(row):
                        if j == i:
                            continue
                        pairs += 1
                        mj = float((out - base).abs().amax(-1)[r, s2:e2].max())
                        leaking += mj > TOL
                        if mj > worst:
                            worst, worst_pair = mj, {"batch": b, "row": r, "changed": i, "moved": j,
                                                     "max_abs_change": mj}
                    worst = max(worst, m)
    finally:
        model.train(was)
    leaks = worst > TOL
    loss_faults = []
    if roles["prompt_counted"]:
        loss_faults.append(f"prompt counted {roles['prompt_counted']}/{roles['prompt_total']}")
    if roles["boundary_counted"]:
        loss_faults.append(f"cross-boundary label counted {roles['boundary_counted']}/{roles['boundary_total']}")
    if roles["padding_counted"]:
        loss_faults.append(f"padding counted {roles['padding_counted']}")
    if roles["response_counted"] < roles["response_total"]:
        loss_faults.append(f"response dropped {roles['response_total'] - roles['response_counted']}")
    if roles["wrong_value"]:
        loss_faults.append(f"labels of a wrong value {roles['wrong_value']}")
    summary = ("LEAKS" if leaks else "isolated") + f" (max other-example change {worst:.2g}, " \
        f"{leaking}/{pairs} pairs > {TOL:g}); loss " + ("FAULT: " + ", ".join(loss_faults) if loss_faults else
                                                        f"ok (prompt 0/{roles['prompt_total']}, response "
                                                        f"{roles['response_counted']}/{roles['response_total']})")
    return {"leaks": leaks, "max_other_change": worst, "leaking_pairs": leaking, "pairs": pairs,
            "worst_pair": worst_pair, "loss_ok": not loss_faults, "loss_faults": loss_faults,
            "labels": roles, "examples": n_ex, "batches": len(batches), "summary": summary,
            "segments": seg_lists}


def batch_evidence(batch: dict, segs: list, tok) -> tuple[list, object]:
    """The examples (token ids) and the response mask of one batch, from the ground truth's split."""
    import torch

    ids = batch["input_ids"]
    mask = torch.zeros(ids.shape, dtype=torch.bool)
    examples = []
    for r, row in enumerate(segs):
        for s, e in row:
            examples.append(ids[r, s:e].tolist())
            mask[r, s + _response_start(ids[r, s:e].tolist(), tok):e] = True
    return examples, mask


# ----------------------------------------------------------------------------------------------
# packsim's verdicts

ISOLATION_PROBES = ("perturbation", "gradient", "attention_mass")


def verdict_of(report) -> dict:
    failed = list(report.failed)
    skipped = list(report.skipped)
    text = report.status.upper()
    if failed:
        text += " (" + ", ".join(failed) + ")"
    elif skipped:
        text += " (skipped: " + ", ".join(skipped) + ")"
    return {"status": report.status, "failed": failed, "skipped": skipped, "verdict": report.verdict,
            "text": text, "table": report.table(), "seconds": round(getattr(report, "seconds", 0.0) or 0.0, 2)}


def agree(v: dict, truth: dict) -> str:
    if "error" in v:
        return "n/a (packsim raised)"
    failed = set(v["failed"])
    says_leak = bool(failed & set(ISOLATION_PROBES))
    says_loss = "loss_coverage" in failed
    problems = []
    if says_leak != truth["leaks"]:
        problems.append("isolation: packsim says " + ("leak" if says_leak else "no leak"))
    if says_loss != (not truth["loss_ok"]):
        problems.append("loss: packsim says " + ("fault" if says_loss else "no fault"))
    other = failed - set(ISOLATION_PROBES) - {"loss_coverage"}
    clean = truth["loss_ok"] and not truth["leaks"]
    if clean and other:
        problems.append("false FAIL of " + ", ".join(sorted(other)))
    if problems:
        return "no: " + "; ".join(problems)
    if clean and v["status"] != "pass":
        return f"partial: {v['status']} (not a pass, not a false fail)"
    return "yes"


# ----------------------------------------------------------------------------------------------
# one pipeline, in its own process

def serve_with_reference_flash(name: str) -> str:
    """Make Axolotl's ModelLoader load the model on packsim's reference flash kernel where the config
    asks for `name` (flash_attention_2 or a hub kernel): nothing else of Axolotl changes."""
    from axolotl.loaders import model as model_loader

    import packsim

    emu = packsim.emulate_flash()
    original = model_loader.ModelLoader._set_attention_config

    def _set_attention_config(self):
        original(self)
        if self.model_kwargs.get("attn_implementation") == name:
            self.model_kwargs["attn_implementation"] = emu.name
            self.model_config._attn_implementation = emu.name

    model_loader.ModelLoader._set_attention_config = _set_attention_config
    return f"{name} -> {emu.name} ({emu.kernel})"


def make_trainer():
    """The factory of the CLI gate row: ``packsim audit --trainer benchmarks/axolotl/run.py:make_trainer``
    with PACKSIM_AXOLOTL_WORK / PACKSIM_AXOLOTL_PIPELINE set (run.py sets them). Builds the pipeline
    the way ``axolotl train`` does and returns Axolotl's trainer. For flash_attention_2 the gate's own
    reference_for_flash_requests serves the kernel; a hub-kernel name gets run.py's shim."""
    import torch
    torch.set_num_threads(1)
    os.environ.update(OFFLINE_ENV)
    pipeline = os.environ["PACKSIM_AXOLOTL_PIPELINE"]
    work = Path(os.environ["PACKSIM_AXOLOTL_WORK"])
    kernel = PIPELINES[pipeline][1]
    if kernel and kernel != REQUESTS:
        serve_with_reference_flash(kernel)
    from axolotl.cli.config import load_cfg
    from axolotl.common.datasets import load_datasets
    from axolotl.train import setup_model_and_trainer
    cfg = load_cfg(str(work / pipeline / "config.yml"))
    trainer, *_ = setup_model_and_trainer(cfg, load_datasets(cfg=cfg))
    return trainer


def run_gate(pipeline: str, work: Path, env: dict) -> dict:
    """The CLI gate on the pipeline's trainer, in a process of its own: its exit code and gate line."""
    t = time.perf_counter()
    cmd = [sys.executable, "-m", "packsim", "audit", "--trainer", f"{Path(__file__).resolve()}:make_trainer"]
    try:
        proc = subprocess.run(cmd, env={**env, "PACKSIM_AXOLOTL_PIPELINE": pipeline, "PACKSIM_AXOLOTL_WORK": str(work)},
                              cwd=ROOT, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = "timeout", e.stdout or "", e.stderr or ""
    (work / f"{pipeline}.gate.log").write_text(f"{out}\n--- stderr ---\n{err}")
    gate = next((ln[5:].strip() for ln in reversed(out.splitlines()) if ln.startswith("gate ")), None)
    v = {"exit_code": rc, "gate": gate, "wall_s": round(time.perf_counter() - t, 1), "stdout": out[-6000:]}
    if gate is None:
        tail = (out + "\n" + (err if isinstance(err, str) else "")).strip().splitlines()
        v["error"] = f"exit {rc}: " + (tail[-1][:300] if tail else "no output")
        v["stderr_tail"] = (err if isinstance(err, str) else "")[-4000:]
        v["text"] = "error: " + v["error"]
        return v
    status = gate.split(":")[0].strip().lower()
    v["status"] = {"not measured": "not measured"}.get(status, status)
    v["failed"] = [x.strip() for x in gate.split(":", 1)[1].split(",")] if status == "fail" else []
    v["skipped"] = []
    v["text"] = f"exit {rc}: {gate}"
    return v


def run_child(pipeline: str, work: Path, out: Path) -> None:
    import contextlib

    import torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    result = {"pipeline": pipeline, "config": PIPELINES[pipeline][0], "rows": [], "notes": []}
    t0 = time.perf_counter()
    try:
        if PIPELINES[pipeline][1] == REQUESTS:
            from packsim.reference.flash_emulation import reference_for_flash_requests
            ctx = reference_for_flash_requests()
        else:
            ctx = contextlib.nullcontext()
        with ctx as flash:
            _run_child(pipeline, work, result)
        if flash is not None:
            result["notes"].append(f"reference_for_flash_requests: models that asked for flash_attention_2: "
                                   f"{flash.models}; emulation: {flash.emulation}")
    except Exception as err:  # the pipeline itself failed to build: one error row per entry point
        result["error"] = f"{type(err).__name__}: {err}".splitlines()[0][:400]
        result["traceback"] = traceback.format_exc()
    result["seconds"] = round(time.perf_counter() - t0, 1)
    out.write_text(json.dumps(result, indent=1, default=str))


def _entry(result, name, fn, truth):
    t = time.perf_counter()
    try:
        v = fn()
    except Exception as err:
        tb = traceback.format_exc()
        v = {"error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:400],
             "traceback": tb, "text": "error: " + f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:200]}
    v["wall_s"] = round(time.perf_counter() - t, 1)
    result["rows"].append({"entry_point": name, "packsim": v, "agree": agree(v, truth)})
    print(f"  [{result['pipeline']}] {name}: {v['text']} ({v['wall_s']}s)", flush=True)


def _run_child(pipeline: str, work: Path, result: dict) -> None:
    import torch

    kernel = PIPELINES[pipeline][1]
    if kernel and kernel != REQUESTS:
        result["notes"].append("kernel served by packsim's reference flash: " + serve_with_reference_flash(kernel))

    from axolotl.cli.config import load_cfg
    from axolotl.common.datasets import load_datasets
    from axolotl.train import execute_training, setup_model_and_trainer

    import packsim
    from packsim.auditing.callback import AuditFailed

    yml = write_yaml(work, pipeline)
    result["yaml"] = yml.read_text()
    cfg = load_cfg(str(yml))
    result["axolotl_cfg"] = {k: cfg.get(k) for k in (
        "attn_implementation", "attn_supports_packing", "attn_decontaminates_packing", "attn_uses_flash_lib",
        "multipack_real_batches", "sample_packing", "pad_to_sequence_len", "train_on_inputs", "sequence_len",
        "micro_batch_size")}
    meta = load_datasets(cfg=cfg)
    trainer, model, tok, _, _ = setup_model_and_trainer(cfg, meta)
    result["trainer"] = {
        "trainer": type(trainer).__name__, "collator": type(trainer.data_collator).__name__,
        "model_attn_implementation": model.config._attn_implementation,
        "sample_packing_drop_attention_mask": getattr(trainer.args, "sample_packing_drop_attention_mask", None),
        "multipack_real_batches": getattr(trainer.args, "multipack_real_batches", None),
        "train_dataset_rows": len(meta.train_dataset)}

    # (a) the batches of Axolotl's own multipack sampler + collator: one epoch of the train dataloader
    batches = [dict(b) for b in trainer.get_train_dataloader()]
    first = batches[0]
    result["batch"] = {"batches_per_epoch": len(batches), "keys": sorted(first),
                       "shape": list(first["input_ids"].shape),
                       "attention_mask_values": (sorted(set(first["attention_mask"].unique().tolist()))
                                                 if "attention_mask" in first else None),
                       "position_ids_row0": first["position_ids"][0].tolist() if "position_ids" in first else None}
    truth = ground_truth(model, batches, tok)
    truth_first = ground_truth(model, [first], tok)
    result["ground_truth"] = {k: v for k, v in truth.items() if k != "segments"}
    result["ground_truth_first_batch"] = {k: v for k, v in truth_first.items() if k != "segments"}
    print(f"  [{pipeline}] ground truth: {truth['summary']}", flush=True)
    examples, rmask = batch_evidence(first, truth_first["segments"][0], tok)
    data_ids = {tuple(x) for x in meta.train_dataset["input_ids"]}
    result["notes"].append(f"examples in batch 0 found among the dataset rows: "
                           f"{sum(tuple(e) in data_ids for e in examples)}/{len(examples)}")

    # (b) packsim on the batch and on the trainer
    _entry(result, ENTRY_POINTS[0], lambda: verdict_of(packsim.audit(model, first, use_cache=False)), truth_first)
    _entry(result, ENTRY_POINTS[1], lambda: verdict_of(packsim.audit(model, first, rmask, examples=examples,
                                                                     use_cache=False)), truth_first)
    _entry(result, ENTRY_POINTS[2], lambda: verdict_of(packsim.audit_trainer(trainer)), truth)

    def callback():
        cb = packsim.AuditCallback(trainer)
        trainer.add_callback(cb)
        try:
            execute_training(cfg, trainer, None)
        except AuditFailed as err:
            v = verdict_of(err.report)
            v["text"] += " - stopped the run before step 1"
            return v
        if cb.report is None:
            raise RuntimeError("AuditCallback ran no audit")
        v = verdict_of(cb.report)
        v["text"] += f" - trained {trainer.state.global_step} step(s)"
        return v

    _entry(result, ENTRY_POINTS[3], callback, truth)
    del torch


# ----------------------------------------------------------------------------------------------
# the parent: build, run each pipeline, tabulate

def versions() -> dict:
    import importlib.metadata as md
    out = {}
    for p in ("axolotl", "transformers", "trl", "torch", "accelerate", "datasets", "peft", "kernels", "packsim"):
        try:
            out[p] = md.version(p)
        except md.PackageNotFoundError:
            out[p] = None
    out["python"] = sys.version.split()[0]
    return out


def table(rows: list[dict]) -> str:
    lines = ["| pipeline | entry point | packsim verdict | ground truth | agree |", "|---|---|---|---|---|"]
    for r in rows:
        cell = lambda s: str(s).replace("|", "\\|").replace("\n", " ")  # noqa: E731
        lines.append(f"| {cell(r['pipeline'])} | {cell(r['entry_point'])} | {cell(r['packsim'])} | "
                     f"{cell(r['ground_truth'])} | {cell(r['agree'])} |")
    return "\n".join(lines)


def facts_table(results: list[dict]) -> str:
    """What Axolotl built for each pipeline (from its own cfg, trainer and first batch)."""
    lines = ["| pipeline | model attn_implementation | Axolotl: attn_supports_packing / drops attention_mask / "
             "multipack_real_batches | first batch: keys, rows x T | ground truth, one epoch |",
             "|---|---|---|---|---|"]
    for r in results:
        c, t, b = r.get("axolotl_cfg") or {}, r.get("trainer") or {}, r.get("batch") or {}
        gt = (r.get("ground_truth") or {}).get("summary") or ("error: " + str(r.get("error")))
        lines.append(f"| {r['pipeline']} | {t.get('model_attn_implementation')} | {c.get('attn_supports_packing')} / "
                     f"{t.get('sample_packing_drop_attention_mask')} / {t.get('multipack_real_batches')} | "
                     f"{', '.join(b.get('keys') or [])}; {' x '.join(map(str, b.get('shape') or []))} | {gt} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pipelines", nargs="*", help=f"some of {list(PIPELINES)} (default: all but flex_attention)")
    ap.add_argument("--all", action="store_true", help="every pipeline, flex_attention included")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    ap.add_argument("--no-write", action="store_true", help="print the table only")
    ap.add_argument("--gate", default=",".join(GATE_DEFAULT),
                    help=f"pipelines that also get the CLI gate row, comma-separated, 'all' or 'none' "
                         f"(default {','.join(GATE_DEFAULT)}; ~25 s each)")
    args = ap.parse_args()
    os.environ.update(OFFLINE_ENV)
    if args.child:
        run_child(args.child, Path(args.work), Path(args.out))
        return 0

    chosen = list(PIPELINES) if args.all else (args.pipelines or DEFAULT)
    gated = set(PIPELINES) if args.gate == "all" else set() if args.gate == "none" else set(args.gate.split(","))
    unknown = [p for p in chosen if p not in PIPELINES]
    if unknown:
        ap.error(f"unknown pipeline(s) {unknown}; choose from {list(PIPELINES)}")
    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="packsim-axolotl-"))
    os.environ["HF_HOME"] = str(work / "hf_home")
    env = {**os.environ, **OFFLINE_ENV, "HF_HOME": str(work / "hf_home")}
    import torch
    torch.set_num_threads(1)
    built = build_work(work)
    print(f"work dir {work}: {built}", flush=True)
    results, rows = [], []
    for p in chosen:
        out = work / f"{p}.json"
        print(f"== {p} ({PIPELINES[p][0]})", flush=True)
        log = work / f"{p}.log"
        with open(log, "w") as f:
            try:
                proc = subprocess.run([sys.executable, __file__, "--child", p, "--work", str(work), "--out", str(out)],
                                      env=env, stdout=subprocess.PIPE, stderr=f, text=True, timeout=CHILD_TIMEOUT_S)
                print(proc.stdout, end="", flush=True)
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        if out.exists():
            res = json.loads(out.read_text())
        else:
            tail = log.read_text()[-3000:]
            res = {"pipeline": p, "config": PIPELINES[p][0], "rows": [], "notes": [],
                   "error": f"child process exited {rc} without a result", "traceback": tail}
        res["log_tail"] = log.read_text()[-2000:] if res.get("error") else None
        if p in gated and not res.get("error"):
            gv = run_gate(p, work, env)
            truth_all = res.get("ground_truth")
            res["rows"].append({"entry_point": ENTRY_POINTS[4], "command": GATE, "packsim": gv,
                                "agree": agree(gv, truth_all) if truth_all else "n/a"})
            print(f"  [{p}] {ENTRY_POINTS[4]}: {gv['text']} ({gv['wall_s']}s)", flush=True)
        results.append(res)
        truth = res.get("ground_truth", {}).get("summary", "not computed")
        if res.get("error"):
            print(f"  [{p}] error: {res['error']}", flush=True)
            rows.append({"pipeline": p, "entry_point": "(pipeline build)", "packsim": "error: " + res["error"],
                         "ground_truth": truth, "agree": "n/a"})
        for r in res["rows"]:
            gt = truth if r["entry_point"] in ENTRY_POINTS[2:] else \
                res.get("ground_truth_first_batch", {}).get("summary", truth)
            rows.append({"pipeline": p, "entry_point": r["entry_point"], "packsim": r["packsim"]["text"],
                         "ground_truth": gt, "agree": r["agree"]})
    md = table(rows)
    print()
    print(md)
    seconds = round(time.perf_counter() - t0, 1)
    print(f"\n{len(rows)} rows in {seconds}s")
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        doc = {"what": "packsim's audit of Axolotl's sample packing, live, vs a ground truth without packsim",
               "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
               "versions": versions(), "cpu_threads": 1, "tolerance": TOL, "setup": built,
               "seconds": seconds, "table": rows, "pipelines": results}
        (RESULTS / "axolotl_live.json").write_text(json.dumps(doc, indent=1, default=str))
        v = doc["versions"]
        head = (f"Measured {doc['date']} on CPU (1 torch thread): axolotl {v['axolotl']}, transformers "
                f"{v['transformers']}, trl {v['trl']}, torch {v['torch']}; run time {seconds}s.\n\n")
        (RESULTS / "table.md").write_text(head + md + "\n\nWhat Axolotl built:\n\n" + facts_table(results) + "\n")
    if not args.keep:
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"kept {work}")
    return 0


if __name__ == "__main__":  # required: datasets' save_to_disk spawns processes that import this file
    sys.exit(main())
