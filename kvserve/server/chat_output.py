"""Splits one chat choice's text into reasoning, content and tool calls with the configured
parsers. Streaming and non-streaming both feed text through it, so they agree."""

from __future__ import annotations

from typing import Any

from kvserve.server.reasoning_parsers import REASONING_PARSERS
from kvserve.server.tool_parsers import TOOL_PARSERS


class ChatOutputSplitter:
    def __init__(self, reasoning: str | None, tools: str | None, prompt_text: str) -> None:
        self.reasoning = REASONING_PARSERS[reasoning](prompt_text) if reasoning else None
        self.tools = TOOL_PARSERS[tools]() if tools else None

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning, content) to emit now."""
        if self.reasoning is not None:
            reasoning, content = self.reasoning.feed(text)
        else:
            reasoning, content = "", text
        if self.tools is not None:
            content = self.tools.feed(content)
        return reasoning, content

    def finish(self) -> tuple[str, str, list[dict[str, Any]]]:
        """(reasoning, content, tool calls) left at the end."""
        reasoning, content = self.reasoning.finish() if self.reasoning is not None else ("", "")
        calls: list[dict[str, Any]] = []
        if self.tools is not None:
            content = self.tools.feed(content)
            rest, calls = self.tools.finish()
            content += rest
        return reasoning, content, calls

    def split_all(self, text: str) -> tuple[str, str, list[dict[str, Any]]]:
        r1, c1 = self.feed(text)
        r2, c2, calls = self.finish()
        return r1 + r2, c1 + c2, calls
