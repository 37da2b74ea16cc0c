import pytest
import torch

from packsim.core.device import get_device, model_device
from packsim.core.errors import PacksimError
from packsim.experiment.run_mode import fast_mode


def test_default_device_follows_cuda_availability(monkeypatch):
    monkeypatch.delenv("PACKSIM_DEVICE", raising=False)
    assert get_device().type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_env_var_and_argument_choose_the_device(monkeypatch):
    monkeypatch.setenv("PACKSIM_DEVICE", "cpu")
    assert get_device() == torch.device("cpu")
    assert get_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_asking_for_cuda_without_it_is_explained():
    with pytest.raises(PacksimError, match="no CUDA device.*device='cpu'"):
        get_device("cuda")


def test_model_device_is_where_the_parameters_are():
    assert model_device(torch.nn.Linear(2, 2).to(torch.device("cpu"))) == torch.device("cpu")
    assert model_device(torch.nn.ReLU()) == torch.device("cpu")  # no parameters: CPU
    if torch.cuda.is_available():
        assert model_device(torch.nn.Linear(2, 2).cuda()).type == "cuda"


def test_unknown_device_name_is_explained():
    with pytest.raises(PacksimError, match="unknown device 'gpu0'"):
        get_device("gpu0")


@pytest.mark.parametrize("value,expected", [("1", True), ("true", True), ("0", False), ("", False), ("no", False)])
def test_fast_mode_reads_the_env_var(monkeypatch, value, expected):
    monkeypatch.setenv("PACKSIM_FAST", value)
    assert fast_mode() is expected
