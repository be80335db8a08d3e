"""What a profile yields: units of work for one client, a request or a multi-turn session."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Turn:
    user: str  # the user message (chat) or the prompt text after the system part (completions)
    max_tokens: int


@dataclass
class Unit:
    """One request, or a chat session whose turns are sent one after another, each carrying the
    history (with the server's real answers) plus a new user message."""

    cls: str
    turns: list[Turn]
    system: str | None = None  # shared prefix: chat system message / completions text prefix
    session: bool = False  # True: the chat endpoint, turn after turn
    at: float | None = None  # trace replay: seconds after the run starts
    ids: list[int] | None = field(default=None, repr=False)  # client ids, completions, if known


def draw_length(rng: random.Random, mean: int, range_ratio: float) -> int:
    """Uniform in [mean*(1-r), mean*(1+r)] (vLLM's --random-range-ratio), at least 1."""
    if range_ratio <= 0:
        return max(1, mean)
    low, high = int(mean * (1 - range_ratio)), int(mean * (1 + range_ratio))
    return max(1, rng.randint(low, high))


def tag(rng: random.Random, label: str) -> str:
    """A unique leading tag: random hex first, so two prompts part ways at their first token."""
    return f"{rng.getrandbits(40):010x} {label}: "
