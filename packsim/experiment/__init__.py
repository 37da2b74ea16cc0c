"""The experiment: train setups side by side on the same data and score them on examples run alone.

One run: ``training`` (its loop and optimiser step), ``evaluation`` (isolated and in-pack scores),
``results`` (``results.json``), ``model_files`` (weights on disk). The comparison of ``packsim
compare`` (its command line is ``packsim.commands.compare``, its report :mod:`packsim.viz.comparison_report`):
``comparison``, ``data_designs`` (what each command's ``--data`` trains on), ``paraphrased_facts``
(the design where the loss curve lies), ``throughput``, ``committed_models`` (the trained models
the course commits), ``forensics`` (what a finished checkpoint's weights tell). ``packsim train``
and data parallelism (lesson 10): ``train_options`` + ``train_command``, ``launch_env``,
``step_plan``, ``rank_balance``, ``normalisation``, ``data_parallel``, ``trainer_parallel``,
``train_outputs``, ``train_runs``; ``context_parallel``. ``run_mode`` (fast or full mode) and
``peak_memory`` (a call's peak resident memory) serve them all.

Lessons: none directly.
"""
