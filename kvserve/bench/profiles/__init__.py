"""Traffic profiles of WORKLOADS.md: one module each; `make_units` picks one from a config."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from kvserve.bench.corpus import TokenPool
from kvserve.bench.profiles import dataset, mixed, random_lengths, shared_prefix, trace
from kvserve.bench.profiles.base import Turn, Unit
from kvserve.bench.tokens import Tokenizer
from kvserve.errors import ConfigError

PROFILES = ("random", "long", "mixed", "shared-prefix", "trace", "dataset")
# profile -> (input_len, output_len) when the flags are not given
DEFAULT_LENGTHS = {"random": (1024, 128), "long": (65536, 1024)}

__all__ = ["PROFILES", "Turn", "Unit", "WorkloadConfig", "make_units"]


@dataclass(frozen=True)
class WorkloadConfig:
    profile: str = "random"
    seed: int = 0
    input_len: int | None = None
    output_len: int | None = None
    range_ratio: float = 0.0
    system_share: float = 0.7
    mixed: mixed.MixedLengths = field(default_factory=mixed.MixedLengths)
    groups: int = 8
    prefix_len: int = 512
    questions: int = 8
    question_len: int = 64
    trace: str | None = None
    time_scale: float = 1.0
    dataset: str | None = None

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ConfigError(f"--profile: unknown {self.profile!r} (one of {', '.join(PROFILES)})")
        if self.profile == "trace" and not self.trace:
            raise ConfigError("--profile trace needs --trace FILE.jsonl")
        if self.profile == "dataset" and not self.dataset:
            raise ConfigError("--profile dataset needs --dataset FILE.json (ShareGPT format)")
        if self.time_scale <= 0:
            raise ConfigError("--time-scale must be positive")
        if not 0 <= self.range_ratio < 1:
            raise ConfigError("--range-ratio must be in [0, 1)")
        for name in ("input_len", "output_len"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1")

    def lengths(self) -> tuple[int, int]:
        default_in, default_out = DEFAULT_LENGTHS.get(self.profile, (1024, 128))
        return self.input_len or default_in, self.output_len or default_out


def make_units(cfg: WorkloadConfig, tokenizer: Tokenizer) -> Iterator[Unit]:
    """The seeded stream of units of ``cfg.profile``; the same seed gives the same stream."""
    rng = random.Random(cfg.seed)
    if cfg.profile == "dataset":
        return dataset.units(dataset.read_dataset(cfg.dataset, tokenizer, cfg.output_len), rng)
    entries = trace.read_trace(cfg.trace) if cfg.profile == "trace" else None
    pool = TokenPool(tokenizer, seed=cfg.seed)
    if entries is not None:
        return trace.units(pool, rng, entries, cfg.time_scale, cfg.seed)
    if cfg.profile == "mixed":
        return mixed.units(pool, rng, cfg.mixed, cfg.system_share)
    n_in, n_out = cfg.lengths()
    if cfg.profile == "shared-prefix":
        return shared_prefix.units(
            pool, rng, cfg.groups, cfg.prefix_len, cfg.questions, cfg.question_len, n_out
        )
    return random_lengths.units(pool, rng, n_in, n_out, cfg.range_ratio, cls=cfg.profile)
