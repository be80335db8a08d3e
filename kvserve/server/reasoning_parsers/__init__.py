"""Reasoning parsers by ``--reasoning-parser`` name (several names, one ``<think>`` format)."""

from __future__ import annotations

from kvserve.server.reasoning_parsers.think import ThinkReasoningParser

REASONING_PARSERS = {
    "think": ThinkReasoningParser,
    "deepseek-r1": ThinkReasoningParser,
    "qwen3": ThinkReasoningParser,
}

__all__ = ["REASONING_PARSERS", "ThinkReasoningParser"]
