"""The experiment: train setups side by side on the same data and score them on examples run alone.

One run: ``training`` (its loop and optimiser step), ``evaluation`` (isolated and in-pack scores),
``results`` (``results.json``), ``model_files`` (weights on disk). The comparison of ``packsim
compare`` (its command line is ``packsim.commands.compare``, its report :mod:`packsim.viz.comparison_report`):
``comparison``, ``data_designs`` (what each command's ``--data`` trains on), ``paraphrased_facts``
(the design where the loss curve lies), ``throughput``, ``committed_models`` (the trained models
the course commits), ``forensics`` (what a finished checkpoint's weights tell). ``pretrained_control``
(a control fine-tuned from a base pretrained on long packs). ``run_mode`` (fast or full mode) and
``peak_memory`` (a call's peak resident memory) serve them all. Training over several processes
(``packsim train``, data and context parallelism) is the room above, :mod:`packsim.scaling`.

This face names each public name's module; importing the package loads none of them (PEP 562).

Lessons: none directly.
"""

from packsim.core.lazy import lazy_names

# public name -> the module that defines it (imported on first access)
_HOMES = {
    "COMMITTED_DIR": "packsim.experiment.committed_models",
    "COMMITTED_SETUPS": "packsim.experiment.committed_models",
    "committed_metadata": "packsim.experiment.committed_models",
    "committed_path": "packsim.experiment.committed_models",
    "export_committed": "packsim.experiment.committed_models",
    "load_committed_model": "packsim.experiment.committed_models",
    "ExperimentConfig": "packsim.experiment.comparison",
    "experiment_config": "packsim.experiment.comparison",
    "load_model": "packsim.experiment.comparison",
    "run_comparison": "packsim.experiment.comparison",
    "COMPARE_DESIGNS": "packsim.experiment.data_designs",
    "TRAIN_DESIGNS": "packsim.experiment.data_designs",
    "make_data": "packsim.experiment.data_designs",
    "evaluate_isolated": "packsim.experiment.evaluation",
    "evaluate_packed": "packsim.experiment.evaluation",
    "example_scores": "packsim.experiment.evaluation",
    "greedy_decode": "packsim.experiment.evaluation",
    "held_out_metrics": "packsim.experiment.evaluation",
    "scores_from_logits": "packsim.experiment.evaluation",
    "Evidence": "packsim.experiment.forensics",
    "ForensicsReport": "packsim.experiment.forensics",
    "PairedGap": "packsim.experiment.forensics",
    "by_position": "packsim.experiment.forensics",
    "flag_comparison": "packsim.experiment.forensics",
    "length_by_place": "packsim.experiment.forensics",
    "measure": "packsim.experiment.forensics",
    "load_weights": "packsim.experiment.model_files",
    "model_path": "packsim.experiment.model_files",
    "read_weights": "packsim.experiment.model_files",
    "save_weights": "packsim.experiment.model_files",
    "ATTRIBUTES": "packsim.experiment.paraphrased_facts",
    "FactsData": "packsim.experiment.paraphrased_facts",
    "make_facts": "packsim.experiment.paraphrased_facts",
    "peak_rise_mib": "packsim.experiment.peak_memory",
    "rss_mib": "packsim.experiment.peak_memory",
    "track_freed_memory": "packsim.experiment.peak_memory",
    "ControlConfig": "packsim.experiment.pretrained_control",
    "load_finetuned": "packsim.experiment.pretrained_control",
    "load_pretrained_control": "packsim.experiment.pretrained_control",
    "run_pretrained_control": "packsim.experiment.pretrained_control",
    "EVAL_KEYS": "packsim.experiment.results",
    "Results": "packsim.experiment.results",
    "RunResult": "packsim.experiment.results",
    "StepRecord": "packsim.experiment.results",
    "TRAIN_KEYS": "packsim.experiment.results",
    "spread": "packsim.experiment.results",
    "fast_mode": "packsim.experiment.run_mode",
    "measure_throughput": "packsim.experiment.throughput",
    "timed_step": "packsim.experiment.throughput",
    "TrainConfig": "packsim.experiment.training",
    "autocast": "packsim.experiment.training",
    "lr_at": "packsim.experiment.training",
    "make_batches": "packsim.experiment.training",
    "make_optimizer": "packsim.experiment.training",
    "optimizer_step": "packsim.experiment.training",
    "train": "packsim.experiment.training",
}

__all__ = sorted(_HOMES)


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())
