"""packsim.scaling.launch_env: rank, world size and local rank from the launcher's environment."""

from __future__ import annotations

from packsim.scaling.launch_env import world


def test_plain_process_is_rank_0_of_1(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert world() == (0, 1, 0)


def test_reads_what_torchrun_sets(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert world() == (3, 4, 1)
