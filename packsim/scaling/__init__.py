"""Scaling out: packed training over several processes (lesson 10), on torch's own engines.

The rooms: ``launch_env`` (``world()``: rank and world size from torchrun's environment),
``step_plan`` (a step's examples over ranks and micro-batches), ``rank_balance`` (the work per rank,
stragglers), ``normalisation`` (the loss normaliser across ranks: global, per rank, mean of means),
``data_parallel`` (the step each rank runs), ``trainer_parallel`` (the same through the transformers
``Trainer``), ``train_options`` (its options, read without torch so ``--help`` answers at once) +
``train_command`` (``packsim train``, its output folder: save, load, compare two, and several runs
launched from a notebook); context parallelism:
``context_parallel`` (how packed documents split over ranks), ``cp_attention`` (torch's context
parallelism wired to a model) and ``cp_compare`` (the torchrun comparison with one process, audited).

This face names each public name's module; importing the package loads none of them (PEP 562).

Lessons: none directly.
"""

from packsim.core.lazy import lazy_names

# public name -> the module that defines it (imported on first access)
_HOMES = {
    "causal_work": "packsim.scaling.context_parallel",
    "contiguous_split": "packsim.scaling.context_parallel",
    "dropped_tokens": "packsim.scaling.context_parallel",
    "pad_lengths": "packsim.scaling.context_parallel",
    "zigzag_split": "packsim.scaling.context_parallel",
    "ATTN_NAME": "packsim.scaling.cp_attention",
    "DocumentRow": "packsim.scaling.cp_attention",
    "LAYOUTS": "packsim.scaling.cp_attention",
    "Shard": "packsim.scaling.cp_attention",
    "cp_logits": "packsim.scaling.cp_attention",
    "cp_loss_backward": "packsim.scaling.cp_attention",
    "document_row": "packsim.scaling.cp_attention",
    "load_balancer": "packsim.scaling.cp_attention",
    "probe_torch_cp": "packsim.scaling.cp_attention",
    "rank_positions": "packsim.scaling.cp_attention",
    "shard_row": "packsim.scaling.cp_attention",
    "unshard": "packsim.scaling.cp_attention",
    "compare": "packsim.scaling.cp_compare",
    "launch": "packsim.scaling.cp_compare",
    "summary": "packsim.scaling.cp_compare",
    "StepOutput": "packsim.scaling.data_parallel",
    "data_parallel_step": "packsim.scaling.data_parallel",
    "train_data_parallel": "packsim.scaling.data_parallel",
    "world": "packsim.scaling.launch_env",
    "NORMALISATIONS": "packsim.scaling.normalisation",
    "backward_scales": "packsim.scaling.normalisation",
    "objective": "packsim.scaling.normalisation",
    "weights": "packsim.scaling.normalisation",
    "COSTS": "packsim.scaling.rank_balance",
    "METHODS": "packsim.scaling.rank_balance",
    "assign": "packsim.scaling.rank_balance",
    "pack_costs": "packsim.scaling.rank_balance",
    "rank_loads": "packsim.scaling.rank_balance",
    "straggler_ratio": "packsim.scaling.rank_balance",
    "BALANCE": "packsim.scaling.step_plan",
    "plan_step": "packsim.scaling.step_plan",
    "select_rows": "packsim.scaling.step_plan",
    "validate": "packsim.scaling.step_plan",
    "torchrun_command": "packsim.scaling.train_command",
    "OPTIONS": "packsim.scaling.train_options",
    "compare_outputs": "packsim.scaling.train_command",
    "load_output": "packsim.scaling.train_command",
    "save_output": "packsim.scaling.train_command",
    "launch_runs": "packsim.scaling.train_command",
    "check_trainer_args": "packsim.scaling.trainer_parallel",
    "train_with_trainer": "packsim.scaling.trainer_parallel",
}

__all__ = sorted(_HOMES)


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals(), subpackages=("normalisation",))
