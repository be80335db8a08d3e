"""Tool-call parsers by ``--tool-call-parser`` name."""

from __future__ import annotations

from kvserve.server.tool_parsers.hermes import HermesToolParser

TOOL_PARSERS = {"hermes": HermesToolParser}

__all__ = ["TOOL_PARSERS", "HermesToolParser"]
