from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from kvserve.preflight.probes.commands import CommandOutput

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "preflight"

Replay = Callable[[Sequence[str]], "CommandOutput | None"]


def replay_runner(recordings: dict[str, str | tuple[int, str]]) -> Replay:
    """A command runner that answers with recorded outputs.

    Keys are the command line joined by spaces (a prefix is enough); values are a fixture file
    name (exit 0) or (exit status, file name). Commands not recorded are "not installed".
    """

    def run(argv: Sequence[str]) -> CommandOutput | None:
        line = " ".join(argv)
        for key, value in recordings.items():
            if line.startswith(key):
                rc, name = value if isinstance(value, tuple) else (0, value)
                return CommandOutput(rc, (FIXTURES / name).read_text())
        return None

    return run


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES
