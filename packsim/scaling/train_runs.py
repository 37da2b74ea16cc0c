"""Several ``packsim train`` runs at once from Python, as a notebook starts them (lesson 10).

:func:`launch_runs` takes ``{name: options}`` (the words ``packsim train`` takes): a run whose
options hold ``--nproc N`` starts N ranks through PyTorch's launcher (``python -m
torch.distributed.run``, :func:`packsim.scaling.train_command.torchrun_command`), the others
train in this process while the launched ones run. Each writes ``out/<name>``
(:mod:`packsim.scaling.train_command`), which it loads back.

Lessons: 10.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from packsim.core.errors import PacksimError
from packsim.scaling.train_command import load_output, main, torchrun_command

__all__ = ["launch_runs"]


def launch_runs(runs: dict[str, list[str]], out: str | Path, threads: int = 1) -> dict[str, dict]:
    """Run every ``packsim train`` run of ``runs`` (name -> options) at the same time; load their outputs.

    Options holding ``--nproc N`` start N ranks through torchrun (:func:`torchrun_command`), in
    fresh processes with ``threads`` torch threads each (``OMP_NUM_THREADS``); the other runs are
    one process: this one, with ``torch.set_num_threads(threads)`` while they run (restored after),
    so every rank and every single process computes with the same number of threads. Outputs go to
    ``out/<name>``; returns ``{name: load_output(out/<name>)}``. A failed run raises with its error.
    """
    out = Path(out)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    argvs = {name: [*options, "--out", str(out / name)] for name, options in runs.items()}
    procs, t0 = {}, time.perf_counter()
    for name, argv in argvs.items():
        if "--nproc" in argv:
            i = argv.index("--nproc")
            cmd = torchrun_command(int(argv[i + 1]), argv[:i] + argv[i + 2 :])
            print(f"{name:12} python {' '.join(cmd[1:])}", flush=True)
            log = tempfile.TemporaryFile("w+")  # a file, not a pipe: a chatty run never blocks on a full pipe
            procs[name] = (subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log, text=True), log)
    errors = {}
    for name, argv in argvs.items():
        if name not in procs:  # one process: here, while the launched runs train
            print(f"{name:12} packsim train {' '.join(argv)}   (in this process)", flush=True)
            errors.update(_train_here(name, argv, threads))
    for name, (proc, log) in procs.items():
        proc.wait()
        log.seek(0)
        if proc.returncode:
            errors[name] = f"exit {proc.returncode}: {log.read()[-1500:]}"
        log.close()
    if errors:
        name, why = next(iter(errors.items()))
        raise PacksimError(f"packsim train run {name!r} failed ({why})")
    print(f"{len(runs)} run(s) finished in {time.perf_counter() - t0:.0f} s", flush=True)
    return {name: load_output(out / name) for name in runs}


def _train_here(name: str, argv: list[str], threads: int) -> dict[str, str]:
    """``packsim train ARGV`` in this process with ``threads`` torch threads; {name: error} if it failed."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        main([*argv, "--quiet"] if "--quiet" not in argv else argv)
    except PacksimError as err:
        return {name: str(err)}
    except SystemExit as exit_:  # argparse rejected an option (it printed why)
        return {name: f"exit {exit_.code}: bad options, see the message above"}
    finally:
        torch.set_num_threads(before)
    return {}
