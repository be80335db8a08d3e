"""Reading JSON-lines files (traces, request records) with one-line errors that name the line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvserve.errors import ConfigError


def read_jsonl(path: Path, what: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yields ``("file:line", object)`` for each non-blank line; ``what`` names the file's role
    in the error for a missing file or a line that is not a JSON object."""
    if not path.is_file():
        raise ConfigError(f"{what}: no such file {str(path)!r}")
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
            except ValueError:
                raise ConfigError(
                    f"{path}:{lineno}: not a JSON line: {line.strip()[:60]!r}"
                ) from None
            if not isinstance(raw, dict):
                raise ConfigError(f"{path}:{lineno}: expected a JSON object")
            yield f"{path}:{lineno}", raw
