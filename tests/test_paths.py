"""packsim.core.paths: the committed runs are found from any working directory."""

from pathlib import Path

import pytest

from packsim.core.errors import PacksimError
from packsim.core.paths import REPO_ROOT, repo_path

ROOT = Path(__file__).resolve().parent.parent


def test_committed_runs_are_found_from_another_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert REPO_ROOT == ROOT
    assert repo_path("results/tasks-full") == ROOT / "results" / "tasks-full"
    assert repo_path("benchmarks/results/attention.json").is_file()


def test_missing_files_say_how_to_get_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PacksimError, match=r"results/no-such-run is not in .* clone it .*packsim compare --out DIR"):
        repo_path("results/no-such-run")
    with pytest.raises(PacksimError, match="make bench"):
        repo_path("benchmarks/results/no-such.json")
    with pytest.raises(PacksimError, match="a path inside the repository"):
        repo_path(tmp_path)


def test_a_clone_in_the_working_directory_is_searched_too(tmp_path, monkeypatch):
    (tmp_path / "results" / "mine").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "results")
    assert repo_path("results/mine") == tmp_path / "results" / "mine"
