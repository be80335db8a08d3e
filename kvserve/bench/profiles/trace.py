"""`trace`: replay a Mooncake-format JSONL trace (`timestamp` ms, `input_length`,
`output_length`, optional `hash_ids`: one id per 512-token block; equal ids -> equal blocks)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kvserve.bench.corpus import TokenPool
from kvserve.bench.jsonl import read_jsonl
from kvserve.bench.profiles.base import Turn, Unit, tag
from kvserve.errors import ConfigError

BLOCK_TOKENS = 512


@dataclass(frozen=True)
class TraceEntry:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] = ()


def _entry(raw: object, where: str) -> TraceEntry:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a JSON object")
    try:
        entry = TraceEntry(
            float(raw.get("timestamp", 0)),
            int(raw["input_length"]),
            int(raw["output_length"]),
            tuple(int(h) for h in raw.get("hash_ids") or ()),
        )
    except KeyError as exc:
        raise ConfigError(f"{where}: missing field {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: bad field value ({exc})") from None
    if entry.input_length < 1 or entry.output_length < 1 or entry.timestamp_ms < 0:
        raise ConfigError(f"{where}: lengths must be >= 1 and timestamp >= 0")
    return entry


def read_trace(path: str | Path) -> list[TraceEntry]:
    path = Path(path)
    entries = [_entry(raw, where) for where, raw in read_jsonl(path, "--trace")]
    if not entries:
        raise ConfigError(f"--trace: {str(path)!r} holds no requests")
    return entries


def _block(pool: TokenPool, seed: int, hash_id: int) -> list[int]:
    return pool.take(random.Random(f"{seed}:{hash_id}"), BLOCK_TOKENS)


def units(
    pool: TokenPool, rng: random.Random, entries: list[TraceEntry], time_scale: float = 1.0,
    seed: int = 0,
) -> Iterator[Unit]:  # fmt: skip
    """Requests at ``timestamp * time_scale`` after the first entry's timestamp."""
    t0 = min(e.timestamp_ms for e in entries)
    for index, e in enumerate(entries):
        ids: list[int] = []
        for h in e.hash_ids:
            ids += _block(pool, seed, h)
        ids = ids[: e.input_length]
        if len(ids) < e.input_length:  # beyond the hashed blocks: text unique to this request
            ids += pool.tagged(tag(rng, f"trace {index}"), rng, e.input_length - len(ids))[1]
        text = pool.tokenizer.decode(ids)
        at = (e.timestamp_ms - t0) / 1000.0 * time_scale
        yield Unit("trace", [Turn(text, e.output_length)], at=at, ids=ids)


def hash_ideal_hit_rate(entries: list[TraceEntry]) -> float:
    """The trace's own ideal: matched leading hash ids x 512 tokens / input tokens."""
    seen: set[tuple[int, ...]] = set()
    hit = total = 0
    for e in entries:
        blocks = 0
        while blocks < len(e.hash_ids) and e.hash_ids[: blocks + 1] in seen:
            blocks += 1
        hit += min(blocks * BLOCK_TOKENS, e.input_length - 1)
        total += e.input_length
        seen.update(e.hash_ids[: k + 1] for k in range(len(e.hash_ids)))
    return hit / total if total else 0.0
