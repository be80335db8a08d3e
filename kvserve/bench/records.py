"""Per-request records: the one source every metric and report is computed from."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from kvserve.bench.jsonl import read_jsonl
from kvserve.errors import ConfigError


@dataclass
class RequestRecord:
    """One request as the client saw it. Times are seconds on the run's monotonic clock."""

    request_id: int
    cls: str = "default"
    session_id: int | None = None
    turn: int = 0
    warmup: bool = False
    start: float = 0.0
    ttft: float | None = None  # seconds from start to the first chunk carrying generated text
    chunk_times: list[float] = field(default_factory=list)  # content chunks, absolute run time
    end: float = 0.0  # arrival of the last chunk of the stream
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens; None: unreported
    completion_tokens: int | None = None
    token_source: str = "usage"  # "usage" (server) or "tokenizer" (client count)
    ideal_cached_tokens: int | None = None  # see ideal.py
    expected_output_tokens: int | None = None
    status: int | None = None
    error: str | None = None
    error_kind: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def e2e(self) -> float:
        return self.end - self.start

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


_FIELDS = {f.name for f in fields(RequestRecord)}


def write_records(path: Path, records: list[RequestRecord]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(rec.to_json() + "\n")


def read_records(path: Path) -> list[RequestRecord]:
    records = []
    for where, raw in read_jsonl(path, "records"):
        try:
            records.append(RequestRecord(**{k: v for k, v in raw.items() if k in _FIELDS}))
        except TypeError as exc:
            raise ConfigError(f"{where}: not a request record ({exc})") from None
    return records
