"""Server-sent events from an OpenAI-compatible stream: split bytes into `data:` payloads and
read the generated text and usage out of each."""

from __future__ import annotations

import json
from dataclasses import dataclass


class SSEBuffer:
    """Feeds raw bytes; yields complete `data:` payloads (events end at a line break)."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[str]:
        self._buf += data
        if b"\n" not in data:
            return []
        *lines, self._buf = self._buf.split(b"\n")
        out = []
        for line in lines:
            if line.startswith(b"data:"):
                out.append(line[5:].strip().decode("utf-8", "replace"))
        return out

    @property
    def leftover(self) -> bytes:
        return self._buf


@dataclass
class Event:
    text: str = ""
    usage: dict | None = None
    error: str | None = None
    done: bool = False


def _choice_text(choice: dict) -> str:
    if "text" in choice:  # completions
        return choice.get("text") or ""
    delta = choice.get("delta") or {}
    return (delta.get("content") or "") + (
        delta.get("reasoning_content") or delta.get("reasoning") or ""
    )


def parse_event(payload: str) -> Event:
    """One payload -> Event; raises ValueError when it is not an OpenAI stream chunk."""
    if payload == "[DONE]":
        return Event(done=True)
    obj = json.loads(payload)
    if not isinstance(obj, dict):
        raise ValueError("stream chunk is not a JSON object")
    if "error" in obj:
        err = obj["error"]
        return Event(error=str(err.get("message", err) if isinstance(err, dict) else err))
    choices = obj.get("choices")
    if choices is None and obj.get("usage") is None:
        raise ValueError("stream chunk has neither 'choices' nor 'usage'")
    text = "".join(_choice_text(c) for c in choices or () if isinstance(c, dict))
    return Event(text=text, usage=obj.get("usage"))
