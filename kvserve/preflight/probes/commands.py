"""Running a system command for a probe; probes take a ``Runner`` so tests replay recordings."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CommandOutput:
    returncode: int
    stdout: str
    stderr: str = ""


# argv -> output, or None when the program is not installed
Runner = Callable[[Sequence[str]], "CommandOutput | None"]


def run_command(argv: Sequence[str], timeout: float = 15.0) -> CommandOutput | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return CommandOutput(124, "", f"{argv[0]} timed out after {timeout:.0f} s")
    except OSError as exc:
        return CommandOutput(126, "", str(exc))
    return CommandOutput(proc.returncode, proc.stdout, proc.stderr)
