"""The folder that holds the two ZeroMQ ipc sockets of one server: ``kvserve-<api pid>-*`` in
the temp dir. The API process removes it when it stops, the engine process when it outlives
the API process; folders whose owner died without either (both killed) are removed at the next
start."""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger("kvserve.engine.ipc")
PREFIX = "kvserve-"
_NAME = re.compile(rf"^{PREFIX}(\d+)-")


def make_socket_dir() -> str:
    remove_stale_socket_dirs()
    return tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")


def is_socket_dir(path: str | Path) -> bool:
    return _NAME.match(Path(path).name) is not None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def remove_stale_socket_dirs(root: str | None = None) -> list[str]:
    """Removes this user's socket folders whose API process is gone; returns their paths."""
    removed = []
    base = Path(root or tempfile.gettempdir())
    for entry in base.glob(f"{PREFIX}*"):
        m = _NAME.match(entry.name)
        try:
            mine = entry.is_dir() and entry.stat().st_uid == os.getuid()
        except OSError:
            continue
        if m and mine and not _alive(int(m.group(1))):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(str(entry))
    if removed:
        log.info("removed %d stale socket folder(s): %s", len(removed), ", ".join(removed))
    return removed
