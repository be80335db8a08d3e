"""Hermes-style tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (one
object or a list of them per block, as Qwen, Hermes and SmolLM2 emit them).

Fed incrementally: text before the first ``<tool_call>`` streams out as content; everything
from it on is held and parsed at the end. Unparseable calls come back as plain content."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from kvserve.server.text_tags import partial_tag_len

START, END = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(START) + r"(.*?)(?:" + re.escape(END) + r"|$)", re.DOTALL)


class HermesToolParser:
    def __init__(self) -> None:
        self.pending = ""  # content held back: it may be the start of <tool_call>
        self.calls_text: str | None = None  # from the first <tool_call> on

    def feed(self, text: str) -> str:
        """Content that is safe to emit now."""
        if self.calls_text is not None:
            self.calls_text += text
            return ""
        self.pending += text
        at = self.pending.find(START)
        if at >= 0:
            content, self.calls_text, self.pending = self.pending[:at], self.pending[at:], ""
            return content
        keep = partial_tag_len(self.pending, START)
        out = self.pending[: len(self.pending) - keep]
        self.pending = self.pending[len(self.pending) - keep :]
        return out

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """The remaining content and the parsed tool calls (OpenAI ``tool_calls`` items)."""
        if self.calls_text is None:
            return self.pending, []
        calls = parse_tool_calls(self.calls_text)
        if calls is None:
            return self.calls_text, []
        return _BLOCK.sub("", self.calls_text).strip(), calls


def parse_tool_calls(text: str) -> list[dict[str, Any]] | None:
    calls: list[dict[str, Any]] = []
    for match in _BLOCK.finditer(text):
        try:
            value = json.loads(match.group(1).strip())
        except json.JSONDecodeError:
            return None
        for item in value if isinstance(value, list) else [value]:
            call = _as_call(item)
            if call is None:
                return None
            calls.append(call)
    return calls or None


def _as_call(item: Any) -> dict[str, Any] | None:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    args = item.get("arguments", item.get("parameters", {}))
    if not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False)
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": item["name"], "arguments": args},
    }
