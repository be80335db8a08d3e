"""Per-request sampling settings, validated at construction (vLLM's names and meanings)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvserve.errors import InvalidRequestError


@dataclass
class SamplingParams:
    n: int = 1
    max_tokens: int | None = None  # None: until a stop condition or the context length
    min_tokens: int = 0
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0 = off
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float = 1.0  # HF-style, over prompt and output tokens
    presence_penalty: float = 0.0  # OpenAI-style, over output tokens
    frequency_penalty: float = 0.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None  # top-N logprobs per output token (0 = only the sampled one)
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.top_k = -1 if self.top_k in (0, None) else self.top_k
        _check(self.n >= 1, "n", f"n must be at least 1, got {self.n}")
        _check(
            self.max_tokens is None or self.max_tokens >= 1,
            "max_tokens",
            f"max_tokens must be at least 1, got {self.max_tokens}",
        )
        _check(self.min_tokens >= 0, "min_tokens", "min_tokens must be non-negative")
        _check(
            self.temperature >= 0,
            "temperature",
            f"temperature must be >= 0, got {self.temperature}",
        )
        _check(0 < self.top_p <= 1, "top_p", f"top_p must be in (0, 1], got {self.top_p}")
        _check(
            self.top_k == -1 or self.top_k >= 1,
            "top_k",
            f"top_k must be -1 or >= 1, got {self.top_k}",
        )
        _check(0 <= self.min_p <= 1, "min_p", f"min_p must be in [0, 1], got {self.min_p}")
        _check(
            self.repetition_penalty > 0,
            "repetition_penalty",
            f"repetition_penalty must be > 0, got {self.repetition_penalty}",
        )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(-2 <= value <= 2, name, f"{name} must be in [-2, 2], got {value}")
        _check(
            self.logprobs is None or 0 <= self.logprobs <= 20,
            "logprobs",
            f"logprobs must be in [0, 20], got {self.logprobs}",
        )
        _check(all(s for s in self.stop), "stop", "stop strings must be non-empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def uses_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )


def _check(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise InvalidRequestError(message, param=param)
