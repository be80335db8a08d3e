"""Targets: something that answers tasks. ``HttpTarget`` (any OpenAI-compatible server) and
``EngineTarget`` (a kvserve engine started in this process); ``parse_target`` reads a spec."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from kvserve.evaluate.completion import Completion
from kvserve.evaluate.tasks import Task

Sink = Callable[[Task, Completion], None]


class Target(Protocol):
    name: str

    @property
    def identity(self) -> str:
        """What the output cache is keyed by, with the target's name."""
        ...

    def run(self, tasks: list[Task], max_tokens: int, concurrency: int, sink: Sink) -> None:
        """Answers every task greedily (temperature 0), calling ``sink`` as each finishes; a
        failed request is a ``Completion`` with ``error`` set, never an exception."""
        ...
