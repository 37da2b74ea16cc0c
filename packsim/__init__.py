"""packsim: pack sequences for LLM fine-tuning correctly, and prove it with tiny models.

The stable API (every name in ``__all__``, loaded on first use so ``import packsim`` stays light):

- examples and the model: :func:`make_examples`, :func:`build_model`;
- packing: :func:`pack`, :func:`pack_arrays` (wrapped, sequential, FFD, BFD);
- :class:`PackedBatch` -- packed rows built for a setup (``PackedBatch.from_examples``);
- :class:`Setup`, :data:`SETUPS`, :func:`get_setup` -- mask x positions x loss, presets ``buggy`` / ``correct`` / ``padded``;
- :func:`varlen_attention`, :func:`available_backends` -- one varlen interface, many kernels;
- :class:`PackingCollator` -- packed, completion-only batches for the transformers ``Trainer``;
- :func:`train`, :class:`TrainConfig`, :func:`evaluate_isolated`, :class:`Results` -- the experiment;
- :func:`audit`, :func:`audit_trainer`, :class:`AuditReport` -- detect contamination in a packed pipeline;
  :class:`AuditCallback` -- the same audit when ``trainer.train()`` starts, stopping a leaking run;
  :func:`audit_logprobs` -- per-sequence log-probs packed vs alone (DPO pairs, RL groups);
  :func:`response_mask_from_features` -- the response tokens of collated features, for the audit;
- :func:`emulate_flash` -- transformers' own flash-attention path on a reference kernel (packsim, pure torch),
  not flash-attn, where no real flash-attn runs (CPU); the real kernel wins where it is there;
- :func:`get_device`, :func:`fast_mode`, :class:`PacksimError`, ``__version__``;
- the course's entry points: :func:`load_committed_model` (the runs the course commits),
  :func:`make_data` (the data designs), :func:`show_solution` (a lesson's reference solution);
- one face per room for the rest, each loading a module on first use: ``packsim.core``,
  ``packsim.auditing``, ``packsim.exhibits``, ``packsim.experiment`` (one run, the comparison, its
  data and results), ``packsim.scaling`` (several processes: data and context parallelism),
  ``packsim.viz``, ``packsim.commands`` (the CLI);
- ``packsim.viz`` (widgets and figures: plotly, ipywidgets) and ``packsim.testing``
  (:func:`~packsim.testing.assert_isolated`) are subpackages, imported by name.
"""

from packsim.core.lazy import lazy_names
from packsim.core.version import __version__

# public name -> the module that defines it (imported on first access, PEP 562)
_HOMES = {
    "make_examples": "packsim.core.data",
    "build_model": "packsim.core.model",
    "pack": "packsim.core.packing",
    "pack_arrays": "packsim.core.packing",
    "PackedBatch": "packsim.core.batch",
    "Setup": "packsim.core.setups",
    "SETUPS": "packsim.core.setups",
    "get_setup": "packsim.core.setups",
    "varlen_attention": "packsim.core.attention",
    "available_backends": "packsim.core.attention_backends",
    "PackingCollator": "packsim.core.collator",
    "get_device": "packsim.core.device",
    "PacksimError": "packsim.core.errors",
    "emulate_flash": "packsim.reference.flash_emulation",
    "fast_mode": "packsim.experiment.run_mode",
    "train": "packsim.experiment.training",
    "TrainConfig": "packsim.experiment.training",
    "evaluate_isolated": "packsim.experiment.evaluation",
    "Results": "packsim.experiment.results",
    "audit": "packsim.auditing.auditor",
    "AuditReport": "packsim.auditing.report",
    "audit_trainer": "packsim.auditing.trainer",
    "audit_logprobs": "packsim.auditing.logprobs",
    "AuditCallback": "packsim.auditing.callback",
    "response_mask_from_features": "packsim.auditing.features",
    # the course's own entry points: its committed models, the data designs, a lesson's reference solution
    "load_committed_model": "packsim.experiment.committed_models",
    "make_data": "packsim.experiment.data_designs",
    "show_solution": "packsim.course.exercises",
}

__all__ = sorted(_HOMES) + ["__version__"]


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals(),
                                  ("viz", "testing", "core", "auditing", "exhibits", "experiment", "scaling", "course",
                                   "commands"))
