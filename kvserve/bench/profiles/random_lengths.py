"""`random` and `long`: fixed or ranged lengths, outputs forced, no accidental prefix sharing."""

from __future__ import annotations

import random
from collections.abc import Iterator

from kvserve.bench.corpus import TokenPool
from kvserve.bench.profiles.base import Turn, Unit, draw_length, tag


def units(
    pool: TokenPool, rng: random.Random, input_len: int, output_len: int, range_ratio: float = 0.0,
    cls: str = "random",
) -> Iterator[Unit]:  # fmt: skip
    index = 0
    while True:
        n_in = draw_length(rng, input_len, range_ratio)
        n_out = draw_length(rng, output_len, range_ratio)
        text, ids = pool.tagged(tag(rng, f"request {index}"), rng, n_in)
        yield Unit(cls, [Turn(text, n_out)], ids=ids)
        index += 1
