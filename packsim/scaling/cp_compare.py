"""Context parallelism on R ranks against one process, and the audit of each layout (lesson 10).

Launched by PyTorch's launcher, one rank per process, gloo on a CPU::

    python -m torch.distributed.run --standalone --nproc-per-node 2 -m packsim.scaling.cp_compare \\
        --out runs/cp.json --tokens 256

Every rank loads the course's committed trained model (``correct``: trained with block-diagonal
masks, :mod:`packsim.experiment.committed_models`), packs one row ``(1, T)`` of held-out task
examples padded for ``R`` ranks (:func:`packsim.scaling.cp_attention.document_row`), and runs:

- the references on one process: the row with a dense document mask (and with a plain causal
  one), loss and gradients, and every document alone;
- each layout of :data:`packsim.scaling.cp_attention.LAYOUTS` on the R ranks: the forward
  (``"documents"``: torch's flex kernel and the dense kernel on the same context-parallel
  BlockMask), one loss and backward with the gradients summed over the ranks, the logits gathered
  back into row order (torch's ``context_parallel_unshard``), and
  :func:`packsim.auditing.context_parallel.audit_context_parallel` on every rank;
- :func:`~packsim.scaling.cp_attention.probe_torch_cp`: what of torch's CP runs here.

Rank 0 writes one JSON: per layout the largest logit difference against one process with the
same mask and against the documents alone (over the documents' own tokens), the step-0 response
loss and its ratio to the ``documents`` run, the largest gradient difference, timings, and the
audit's status, verdict and context-parallel finding. :func:`launch` starts it from Python (the
lesson, ``tests/test_cp_compare.py``, ``benchmarks/context_parallel.py``); :func:`summary` prints it.

Lessons: 10.
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

import torch
import torch.distributed as dist
import torch.nn.functional as F

from packsim.core.errors import PacksimError
from packsim.core.loss import IGNORE_INDEX
from packsim.core.masks import block_diagonal_mask, to_additive_4d

__all__ = ["launch", "compare", "summary", "main"]


def _one_process(model, row, doc_ids) -> dict:
    """The whole row on one process under the mask of ``doc_ids`` (1, T): logits, loss, gradients."""
    model.zero_grad(set_to_none=True)
    mask = to_additive_4d(block_diagonal_mask(doc_ids))  # (1, 1, T, T)
    logits = model(input_ids=row.input_ids, position_ids=row.position_ids, attention_mask=mask,
                   use_cache=False).logits  # (1, T, V)
    loss = F.cross_entropy(logits[0], row.targets[0], ignore_index=IGNORE_INDEX)
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    return {"logits": logits.detach(), "loss": float(loss), "grads": grads}


def _alone(model, row) -> torch.Tensor:
    """(1, T, V): every document (padded segment) of the row run alone, positions from 0."""
    parts, start = [], 0
    with torch.no_grad():
        for length in row.lengths:
            ids = row.input_ids[:, start : start + length]
            parts.append(model(input_ids=ids, position_ids=torch.arange(length)[None], use_cache=False).logits)
            start += length
    return torch.cat(parts, dim=1)


def _layout_run(model, row, mesh, layout: str, ref: dict, alone: torch.Tensor) -> dict:
    """One layout on this rank: forward, loss and backward, the gathered logits, the audit."""
    from packsim.auditing.context_parallel import audit_context_parallel
    from packsim.scaling.cp_attention import cp_logits, cp_loss_backward, shard_row, unshard

    clock = [time.perf_counter()]

    def lap() -> float:
        clock.append(time.perf_counter())
        return clock[-1] - clock[-2]

    real = row.real_mask()  # (T,) the documents' own tokens
    shard = shard_row(row, mesh, layout)
    seconds = {"shard": lap()}
    kernel = "flex" if layout == "documents" else "ring"
    with torch.no_grad():
        local = cp_logits(model, shard, kernel)  # (1, T/R, V)
    seconds["forward"] = lap()
    model.zero_grad(set_to_none=True)
    loss, local_grad_run = cp_loss_backward(model, shard)
    seconds["loss_backward"] = lap()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    full = unshard(shard, local)  # (1, T, V) in row order
    res = {
        "kernel": kernel,
        "max_logit_diff_one_process": float((full - ref["logits"])[0, real].abs().max()),
        "max_logit_diff_alone": float((full - alone)[0, real].abs().max()),
        "loss": loss,
        "loss_one_process": ref["loss"],
        "max_grad_diff": float((grads - ref["grads"]).abs().max()),
        "max_grad": float(ref["grads"].abs().max()),
        "seconds": seconds,
    }
    if layout == "documents":  # torch's flex kernel (no backward on CPU) vs the dense kernel of the backward
        res["max_logit_diff_flex_vs_dense"] = float((full - unshard(shard, local_grad_run)).abs().max())

    def cp_forward(ids):
        return cp_logits(model, shard.reshard_ids(ids), kernel)

    lap()
    report = audit_context_parallel(model, cp_forward, row.input_ids, row.lengths, shard.held,
                                    position_ids=shard.position_ids, targets=shard.targets, group=mesh.get_group())
    finding = next(f for f in report.findings if f.name == "context_parallel")
    res["audit"] = {"status": report.status, "failed": report.failed, "verdict": report.verdict,
                    "perturbation": report.probes["perturbation"].value, "finding": finding.status,
                    "evidence": finding.evidence, "cause": report.causes[0] if report.causes else "",
                    "seconds": lap()}
    return res


def compare(model, row, mesh) -> dict:
    """Every layout on this rank (a collective: all ranks call it); the same dict on every rank."""
    from packsim.scaling.cp_attention import LAYOUTS

    refs = {"documents": _one_process(model, row, row.doc_ids),
            "ring_causal": _one_process(model, row, torch.zeros_like(row.doc_ids))}
    alone = _alone(model, row)
    out: dict = {"one_process": {k: {"loss": v["loss"]} for k, v in refs.items()},
                 "layouts": {layout: _layout_run(model, row, mesh, layout, refs[layout], alone) for layout in LAYOUTS}}
    correct = out["layouts"]["documents"]["loss"]
    for res in out["layouts"].values():
        res["loss_ratio"] = res["loss"] / correct
    return out


def main(argv: list[str] | None = None) -> int:
    """One rank of the comparison (under torchrun); rank 0 writes ``--out``."""
    from torch.distributed.device_mesh import init_device_mesh

    from packsim.core.data import make_examples
    from packsim.experiment.committed_models import load_committed_model
    from packsim.scaling.cp_attention import document_row, probe_torch_cp

    p = argparse.ArgumentParser(prog="python -m packsim.scaling.cp_compare")
    p.add_argument("--out", required=True, help="the JSON file rank 0 writes")
    p.add_argument("--tokens", type=int, default=256, help="the packed row's length T (a multiple of ranks x 128)")
    p.add_argument("--seed", type=int, default=7, help="which task examples fill the row")
    args = p.parse_args(argv)
    if "RANK" not in os.environ:
        raise PacksimError("cp_compare runs under torchrun: python -m torch.distributed.run --standalone "
                           "--nproc-per-node 2 -m packsim.scaling.cp_compare --out FILE")
    t0 = time.perf_counter()
    dist.init_process_group("gloo")
    try:
        R = dist.get_world_size()
        mesh = init_device_mesh("cpu", (R,), mesh_dim_names=("cp",))
        model = load_committed_model("correct")
        model.set_attn_implementation("sdpa")  # the references; the CP forward switches to its own
        row = document_row(make_examples(args.tokens // 4 + 16, seed=args.seed), args.tokens, R)
        probe = probe_torch_cp(mesh)
        result = compare(model, row, mesh)
        result.update(probe=probe, world_size=R, tokens=row.T, lengths=row.lengths, real=row.real,
                      torch=torch.__version__, backend=dist.get_backend(), model="committed correct (tiny Llama)",
                      wall_s=time.perf_counter() - t0)
        if dist.get_rank() == 0:
            Path(args.out).write_text(json.dumps(result, indent=1))
    finally:
        dist.destroy_process_group()
    return 0


def launch(nproc: int = 2, tokens: int = 256, seed: int = 7, timeout: float = 600, quiet: bool = False) -> dict:
    """Run :func:`main` on ``nproc`` gloo ranks through torchrun (one thread each); its JSON as a dict."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cp.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               "-m", "packsim.scaling.cp_compare", "--out", str(out), "--tokens", str(tokens), "--seed", str(seed)]
        if not quiet:
            print("python " + " ".join(cmd[1:]), flush=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        with tempfile.TemporaryFile("w+") as log:  # a file, not a pipe: a chatty rank never blocks
            proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True, timeout=timeout)
            if proc.returncode:
                log.seek(0)
                raise PacksimError(f"the {nproc}-rank context-parallel run failed (exit {proc.returncode}): "
                                   f"{log.read()[-2000:]}")
        return json.loads(out.read_text())


def summary(result: dict) -> str:
    """The comparison as lines of text: one per layout, then the audit's verdicts, then the probe."""
    R, T = result["world_size"], result["tokens"]
    docs = len(result["real"])
    filler = len(result["lengths"]) - docs  # the padding segment that fills the row (the audit checks it too)
    lines = [f"{R} gloo ranks, one packed row of {T} tokens: {docs} documents" + (" and a padding filler" if filler else "")
             + f", torch {result['torch']}"]
    for name, r in result["layouts"].items():
        lines.append(f"{name:12} vs one process (same mask): max |logit diff| {r['max_logit_diff_one_process']:.1e}, "
                     f"max |grad diff| {r['max_grad_diff']:.1e} (largest gradient {r['max_grad']:.1e}); vs each "
                     f"document alone: {r['max_logit_diff_alone']:.2g}; step-0 loss {r['loss']:.4f} "
                     f"({r['loss_ratio']:.2f}x the documents run)")
    for name, r in result["layouts"].items():
        a = r["audit"]
        lines.append(f"audit {name:12} {a['status'].upper():4} (context_parallel finding: {a['finding']}): {a['verdict']}")
    lines += [f"torch here: {k}: {v}" for k, v in result["probe"].items()]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
