"""Helpers for parsers that cut model output at tags while it streams."""

from __future__ import annotations


def partial_tag_len(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that could be the start of ``tag``: the part a
    streaming parser must hold back until more text decides it."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
