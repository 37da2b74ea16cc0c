"""The ``packsim`` subcommands, one module each (the layout of TRL's ``trl/cli/commands/``): every module
has ``add_arguments(parser)`` and ``run(args) -> int``; :mod:`packsim.cli` wires them up. The work
itself lives in the room it belongs to; a command module holds the options and the call.

=================  ==========================================  =====================================
command            module                                      what it runs
=================  ==========================================  =====================================
``doctor``         :mod:`packsim.commands.doctor`              the library's checks (``--course``:
                                                               the notebooks' packages required)
``compare``        :mod:`packsim.commands.compare`             experiment.comparison, then
                                                               viz.comparison_report's report.html
``compare-report`` :mod:`packsim.commands.compare_report`      rebuild a comparison's report.html
                                                               (``report``: its old name, an alias)
``audit``          :mod:`packsim.commands.audit`               auditing.command (the gate) or
                                                               exhibits.gate_demo (the demo)
``train``          :mod:`packsim.commands.train`               scaling.train_command
=================  ==========================================  =====================================

Options come from modules that do not import torch, so ``--help`` and a bad option answer at once.

Lessons: none directly.
"""

from __future__ import annotations

__all__ = ["ALIASES", "OPTIONS", "SUBCOMMANDS"]

# name -> (module with run(args), help); OPTIONS names the module with add_arguments where it differs
SUBCOMMANDS = {
    "doctor": ("packsim.commands.doctor", "check the environment: packages, device, attention backends "
               "(--course: the notebooks' packages too)"),
    "compare": ("packsim.commands.compare", "train setups side by side; write results.json and report.html"),
    "compare-report": ("packsim.commands.compare_report", "rebuild report.html from a comparison's results.json "
                       "(not the audit's report: packsim audit prints that)"),
    "audit": ("packsim.commands.audit",
              "pre-flight audit of a local checkpoint and JSONL data (--model DIR --data FILE "
              "--collator NAME) or of your own trainer (--trainer FILE.py:FUNC); exit 0 pass, 1 fault, "
              "2 bad input, 3 not measured or unverified, 4 the audit crashed (a bug); without them, the "
              "built-in tiny pipeline"),
    "train": ("packsim.commands.train", "train one setup on one process, or data-parallel under torchrun"),
}
OPTIONS = {"train": "packsim.scaling.train_options", "audit": "packsim.auditing.command"}
ALIASES = {"report": "compare-report"}  # old names still accepted
