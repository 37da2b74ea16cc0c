"""The reaches packsim's library makes into another library's private machinery, one module each.

A transformers, TRL or ``kernels`` release that moves one of these breaks packsim in exactly one
place, and the pin test beside each module (``tests/test_upstream_*.py``) fails first, naming what
moved and the version the reach was read from. The exhibits and the lessons show internals on
purpose and keep their own reaches. Still outside (used where they are called, run on both window
ends by .ci/window): the transformers ``Trainer`` calls the trainer audit makes as the training loop
does (``_prepare_inputs``, ``get_batch_samples``, ``current_gradient_accumulation_steps``) and reads of
``config._attn_implementation``.

    hub_kernels   transformers' kernel wrappers for the hybrid families (causal_conv1d, mamba_ssm, fla)
    flash_utils   transformers' flash path: ``_lazy_imports`` and the attention / mask registries
    loggers       messages transformers logs that packsim's probes provoke on purpose
    trl_trainers  TRL's trainers: the chunked-CE forward TRL 1.9's SFTTrainer leaves on the model, the
                  metrics they log, the MoE router aux loss SFTTrainer adds
    outputs       transformers' names for the cache (output field, forward keyword) and checkpointing
    accelerate_cp accelerate's context-parallel hooks (mask dropped, is_causal) as the Trainer runs them
    torch_cp      the private names of torch's context parallelism that lesson 10, the ring exhibit and
                  the CP audit call where they teach them, and the order its per-document balancer
                  makes in each release
    window        the tested versions, and the notice outside them

Lessons: none directly.
"""
