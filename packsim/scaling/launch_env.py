"""Where this process sits in a launch, read from the launcher's environment.

torchrun and accelerate start every process with ``RANK`` (its place among all processes),
``WORLD_SIZE`` (how many there are) and ``LOCAL_RANK`` (its place on this machine: the GPU it
uses); a process started plainly has none of them and is rank 0 of 1.

Lessons: none directly.
"""

from __future__ import annotations

import os

__all__ = ["world"]


def world() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from the launcher's environment; (0, 1, 0) when run plainly."""
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
            int(os.environ.get("LOCAL_RANK", 0)))
