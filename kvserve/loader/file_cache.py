"""Where kvserve caches what it derives from a model file, and the key of one file version.

``KVSERVE_CACHE_DIR`` moves the cache (default ``$XDG_CACHE_HOME/kvserve``, else
``~/.cache/kvserve``); empty turns it off. An entry is keyed by the file's path, size and mtime
and by the versions of whatever produced it, so a rewritten file or a new library misses."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path


def cache_root() -> Path | None:
    value = os.environ.get("KVSERVE_CACHE_DIR")
    if value is not None:
        return Path(value) if value else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kvserve"


def entry_path(kind: str, model_path: str, versions: str) -> Path | None:
    """``<root>/<kind>/<hash of the file version and versions>``; None when caching is off."""
    root = cache_root()
    if root is None:
        return None
    st = os.stat(model_path)
    key = f"{model_path}\0{st.st_size}\0{st.st_mtime_ns}\0{versions}"
    return root / kind / hashlib.sha256(key.encode()).hexdigest()[:32]


def write_json(entry: Path, payload: object) -> None:
    """Writes ``payload`` as JSON whole or not at all (a temp file beside it, then a rename), so
    another process never reads half of it; a failure (a read-only or full disk) raises and
    leaves no temp file."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=entry.parent, prefix=".partial-")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(payload, out)
        os.replace(tmp, entry)
    finally:
        if os.path.exists(tmp):  # not renamed: the write failed
            os.unlink(tmp)
