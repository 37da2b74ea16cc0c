import pytest

from packsim.cli import main


def test_doctor_passes_here(capsys):
    assert main(["doctor", "--quiet"]) == 0
    assert "all required checks passed" in capsys.readouterr().out


def test_unknown_command_shows_usage(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["fly"])
    assert exc.value.code == 2 and "doctor" in capsys.readouterr().err
