"""The ``kvserve`` command line run as users run it: a real subprocess, output captured."""

from __future__ import annotations

import subprocess
import sys


def run_kvserve(
    *args: str, timeout: float = 120, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvserve.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,  # type: ignore[arg-type]
    )
