"""The engine process dies with its API process: the kernel sends it SIGTERM when the parent
exits (``PR_SET_PDEATHSIG`` on Linux), and the loop checks the parent pid on every iteration,
busy or idle (ZeroMQ does not notice a vanished peer). SIGTERM while the parent lives is
ignored: the API process drains first and then tells the engine to stop."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from types import FrameType

log = logging.getLogger("kvserve.engine.ipc.core_process")
_PR_SET_PDEATHSIG = 1


class ParentGone(SystemExit):
    """Raised in the engine process when its API process has exited."""

    def __init__(self) -> None:
        super().__init__(3)


def parent_alive(parent_pid: int) -> bool:
    return os.getppid() == parent_pid


def die_with_parent(parent_pid: int) -> None:
    """Arms the parent-death signal and the handlers; raises ``ParentGone`` if the parent is
    already gone (it may have died before the signal was armed)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):  # the pid poll in the loop still covers it
            log.warning("prctl(PR_SET_PDEATHSIG) is unavailable; relying on the pid poll")

    def on_sigterm(sig: int, frame: FrameType | None) -> None:
        if not parent_alive(parent_pid):
            raise ParentGone()

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the API process, which drains
    if not parent_alive(parent_pid):
        raise ParentGone()
