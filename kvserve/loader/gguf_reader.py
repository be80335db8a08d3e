"""Opening a GGUF file and reading its metadata fields as plain Python values."""

from __future__ import annotations

import functools
from typing import Any

from kvserve.errors import ModelLoadError
from kvserve.loader.files import one_line


@functools.lru_cache(maxsize=4)
def open_gguf(path: str) -> Any:
    """A memory-mapped ``gguf.GGUFReader``; a truncated or corrupt file gives ModelLoadError."""
    from gguf import GGUFReader

    try:
        return GGUFReader(path)
    except Exception as exc:  # gguf raises ValueError, struct.error, IndexError, ... on bad input
        raise ModelLoadError(
            f"{path}: not a readable GGUF file (truncated or corrupt?): {one_line(exc)}"
        ) from exc


def gguf_field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()
