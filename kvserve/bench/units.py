"""Parsing of durations and lists given on the command line (`2s`, `100ms`, `10m`, `1,2,4`)."""

from __future__ import annotations

import re

from kvserve.errors import ConfigError

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h)?\s*$")
_SCALE = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str, what: str = "duration") -> float:
    """Seconds from '250ms', '2s', '1.5', '10m', '1h' (a bare number is seconds)."""
    match = _DURATION.match(str(text))
    if not match:
        raise ConfigError(f"{what}: cannot read {text!r} as a duration (e.g. 500ms, 2s, 10m)")
    value = float(match.group(1)) * _SCALE[match.group(2)]
    if value <= 0:
        raise ConfigError(f"{what}: must be positive, got {text!r}")
    return value


def parse_int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{what}: expected comma-separated integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise ConfigError(f"{what}: expected positive integers, got {text!r}")
    return values


def parse_key_values(items: list[str], what: str) -> dict[str, str]:
    """'a=1,b=2' items (repeatable flag) -> {'a': '1', 'b': '2'}."""
    out: dict[str, str] = {}
    for item in items:
        for part in item.split(","):
            if not part.strip():
                continue
            key, sep, value = part.partition("=")
            if not sep or not key.strip() or not value.strip():
                raise ConfigError(f"{what}: expected key=value, got {part!r}")
            out[key.strip().lower()] = value.strip()
    return out
