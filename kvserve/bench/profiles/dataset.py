"""`dataset`: first human turn and its answer's length from a user-supplied ShareGPT JSON file."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

from kvserve.bench.profiles.base import Turn, Unit
from kvserve.bench.tokens import Tokenizer
from kvserve.errors import ConfigError


def _pairs(data: object) -> Iterator[tuple[str, str]]:
    if not isinstance(data, list):
        raise ConfigError("--dataset: expected a JSON list of {'conversations': [...]} objects")
    for item in data:
        conv = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(conv, list) or len(conv) < 2:
            continue
        first, second = conv[0], conv[1]
        if isinstance(first, dict) and isinstance(second, dict):
            yield str(first.get("value", "")), str(second.get("value", ""))


def read_dataset(path: str | Path, tokenizer: Tokenizer, max_output: int | None) -> list[Unit]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--dataset: no such file {str(path)!r}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ConfigError(f"--dataset: {str(path)!r} is not JSON ({exc})") from None
    out = []
    for prompt, answer in _pairs(data):
        n_out = len(tokenizer.encode(answer))
        if len(tokenizer.encode(prompt)) < 4 or n_out < 4:  # vLLM's filter for tiny pairs
            continue
        out.append(Unit("dataset", [Turn(prompt, min(n_out, max_output or n_out))]))
    if not out:
        raise ConfigError(f"--dataset: no usable conversations in {str(path)!r} (ShareGPT format)")
    return out


def units(items: list[Unit], rng: random.Random) -> Iterator[Unit]:
    """Shuffled once with the seed; cycles when more requests are asked than the file holds."""
    order = list(items)
    rng.shuffle(order)
    while True:
        yield from order
