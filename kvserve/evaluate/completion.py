"""What a target returned for one task."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Completion:
    text: str
    completion_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None  # set: the request failed; ``text`` is "" and scores as wrong

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Completion:
        return cls(str(obj.get("text", "")), int(obj.get("completion_tokens") or 0),
                   obj.get("finish_reason"), obj.get("error"))  # fmt: skip
