"""packsim.core.upstream.accelerate_cp: accelerate's context-parallel hooks and the Trainer's CP inputs, on the
installed accelerate (read from 1.13.0 and 1.16.0) and transformers (5.16.1 and 5.25.0)."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers
from accelerate.parallelism_config import ParallelismConfig
from packaging.version import Version

from packsim.core.upstream.accelerate_cp import (
    build_refusal,
    context_parallel_size,
    cp_attention_hooks,
    hooked_modules,
)
from packsim.core.upstream.window import TESTED

ACCELERATE = Version(importlib.metadata.version("accelerate"))
MOVED = (f"accelerate {ACCELERATE} moved its context-parallel hooks (read from 1.13.0 and 1.16.0, "
         "big_modeling._attach_context_parallel_hooks): read the new source, update "
         "packsim.core.upstream.accelerate_cp and this pin")


class _Attention(torch.nn.Module):
    def forward(self, x, attention_mask=None, is_causal=None):
        self.seen = (attention_mask, is_causal)
        return x


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.ModuleDict({"self_attn": _Attention()}) for _ in range(2)])
        self.mlp = _Attention()  # not a self_attn: no hook


def test_the_window_reads_accelerate():
    low, high = (Version(v) for v in TESTED["accelerate"])
    assert low <= Version("1.13.0") and high >= Version("1.16.0")


def test_the_hook_drops_the_mask_and_sets_is_causal_on_self_attn_modules_only():
    model, mask = _Model(), torch.ones(1, 4)
    with cp_attention_hooks(model) as names:
        assert names == ["layers.0.self_attn", "layers.1.self_attn"] == hooked_modules(model)
        model.layers[0]["self_attn"](torch.zeros(1), attention_mask=mask)
        model.mlp(torch.zeros(1), attention_mask=mask)
        assert model.layers[0]["self_attn"].seen == (None, True), MOVED
        assert model.mlp.seen[0] is mask
    model.layers[0]["self_attn"](torch.zeros(1), attention_mask=mask)  # hooks gone after the block
    assert model.layers[0]["self_attn"].seen == (mask, None)


def test_only_the_hooks_it_added_are_removed():
    model = _Model()
    attn = model.layers[1]["self_attn"]
    mine = attn.register_forward_pre_hook(lambda m, args, kwargs: None, with_kwargs=True)
    with cp_attention_hooks(model):
        assert len(attn._forward_pre_hooks) == 2
    assert list(attn._forward_pre_hooks) == [mine.id] and mine.id in attn._forward_pre_hooks_with_kwargs


def test_context_parallel_size_reads_the_parallelism_config():
    def trainer(config):
        return SimpleNamespace(accelerator=SimpleNamespace(parallelism_config=config))
    assert context_parallel_size(trainer(None)) == 1
    assert context_parallel_size(trainer(ParallelismConfig(cp_size=1))) == 1
    assert ParallelismConfig(cp_size=2).cp_backend == "torch"  # the default this module assumes
    assert context_parallel_size(trainer(ParallelismConfig(cp_size=2))) == 2
    assert context_parallel_size(SimpleNamespace()) == 1


def test_the_trainer_refuses_other_than_sdpa_and_shards_position_ids():
    """transformers' Trainer._prepare_context_parallel_inputs, called as the training step calls it."""
    fake = SimpleNamespace(accelerator=SimpleNamespace(parallelism_config=ParallelismConfig(cp_size=2),
                                                       maybe_context_parallel=lambda **kw: kw))
    eager = SimpleNamespace(config=SimpleNamespace(_attn_implementation="eager"))
    inputs = {"input_ids": torch.zeros(1, 8, dtype=torch.long), "labels": torch.zeros(1, 8, dtype=torch.long),
              "position_ids": torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4]])}
    with pytest.raises(ValueError, match="SDPA"):
        transformers.Trainer._prepare_context_parallel_inputs(fake, eager, dict(inputs))
    sdpa = SimpleNamespace(config=SimpleNamespace(_attn_implementation="sdpa"))
    context, prepared = transformers.Trainer._prepare_context_parallel_inputs(fake, sdpa, dict(inputs))
    buffers = context.keywords["buffers"]
    assert any(b is prepared["position_ids"] for b in buffers)  # positions restart per document, sharded
    assert "shift_labels" in prepared  # shifted once over the whole row, before sharding


# ----------------------------------------------------------------------------- a CP Trainer that cannot be built here

ROOT = Path(__file__).resolve().parents[1]
CP_FACTORY = """
import tempfile
import transformers
from accelerate.parallelism_config import ParallelismConfig
import packsim

def make_trainer():
    args = transformers.TrainingArguments(tempfile.mkdtemp(), per_device_train_batch_size=2, report_to=[],
                                          use_cpu=True, parallelism_config=ParallelismConfig(cp_size=2))
    data = [{"prompt_ids": e.prompt, "response_ids": e.response} for e in packsim.make_examples(4)]
    return transformers.Trainer(model=packsim.build_model("tiny", seed=0, attn_implementation="sdpa"), args=args,
                                train_dataset=data, data_collator=packsim.PackingCollator("correct"))
"""


def _gate(tmp_path, *launch) -> subprocess.CompletedProcess:
    """``packsim audit --trainer`` on a factory whose TrainingArguments hold cp_size=2, in fresh processes."""
    (tmp_path / "cp_train.py").write_text(CP_FACTORY)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env = {k: v for k, v in env.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    return subprocess.run([sys.executable, *launch, "-m", "packsim", "audit", "--trainer", "cp_train.py:make_trainer"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)


def test_one_plain_process_cannot_build_a_parallelism_config_and_the_gate_names_the_launcher(tmp_path):
    """One process: the config's device mesh starts a process group, and torch's env:// rendezvous
    raises without torchrun's environment."""
    out = _gate(tmp_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "environment variable RANK expected" in lines[0], lines[0]  # torch's rendezvous: the fact read
    assert "torchrun --nproc_per_node N -m packsim audit --trainer cp_train.py:make_trainer" in lines[0]


def test_cpu_processes_cannot_build_a_context_parallel_trainer_and_the_gate_names_the_gpus(tmp_path):
    """Two gloo ranks under torchrun: accelerate's _validate_accelerator refuses DistributedType.MULTI_CPU."""
    out = _gate(tmp_path, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2")
    lines = [line for line in out.stderr.splitlines() if line.startswith("packsim audit:")]
    assert out.returncode != 0 and len(lines) == 2, out.stderr[-2000:]  # one line per rank, each exit 2
    assert all("but got DistributedType.MULTI_CPU" in line for line in lines), MOVED  # accelerate's refusal
    assert all("only on GPUs, not in CPU processes" in line and "context-parallel" in line for line in lines)


def test_any_other_error_is_not_a_parallelism_refusal():
    with pytest.raises(ValueError) as raised:  # an error from inside transformers, not the ParallelismConfig
        transformers.AutoConfig.for_model("no_such_model_type")
    assert build_refusal(raised.value) is None
    with pytest.raises(RuntimeError) as raised:
        raise RuntimeError("no GPU here")
    assert build_refusal(raised.value) is None
