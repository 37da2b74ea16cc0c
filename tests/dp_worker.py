"""Several ``packsim train`` commands in ONE launch (torchrun or accelerate), for tests/test_data_parallel.py.

Usage (under a launcher): ``dp_worker.py '<json list of argv lists>'``. The process group is
created once (gloo) and reused by every command, so the tests pay the launch only once.
"""

from __future__ import annotations

import json
import sys

import torch.distributed as dist

from packsim.cli import main

if __name__ == "__main__":
    dist.init_process_group("gloo")
    for argv in json.loads(sys.argv[1]):
        main(["train", *argv])
    dist.destroy_process_group()
