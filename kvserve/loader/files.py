"""Small file helpers that turn library exceptions into one-line ``ModelLoadError``s."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvserve.errors import ModelLoadError


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message (library messages can span many lines)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def read_json_object(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path}: not valid JSON: {one_line(exc)}") from exc
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data
