from __future__ import annotations

from cli_runner import run_kvserve

from kvserve.cli import COMMANDS, main


def test_help_lists_every_command(capsys) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert name in out


def test_unknown_command_is_one_line_error() -> None:
    proc = run_kvserve("nonsense")
    assert proc.returncode == 2
    assert "unknown command 'nonsense'" in proc.stderr
    assert "Traceback" not in proc.stderr
