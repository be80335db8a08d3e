"""A progress bar on stderr while one target answers, redrawn at most 4 times a second.

Outputs arrive in bursts (a whole engine batch at once), so the rate shown is the average
since the start, not a sliding window."""

from __future__ import annotations

import sys
import time

from kvserve.evaluate.completion import Completion


class ProgressBar:
    def __init__(self, label: str, total: int, quiet: bool = False) -> None:
        self.label, self.total, self.quiet = label, total, quiet
        self.done = self.failed = self.tokens = 0
        self.t0 = time.perf_counter()
        self._last = -1.0

    def update(self, completion: Completion) -> None:
        self.done += 1
        self.failed += 0 if completion.ok else 1
        self.tokens += completion.completion_tokens
        now = time.perf_counter() - self.t0
        if now - self._last >= 0.25:
            self._last = now
            self._draw(now)

    def close(self) -> None:
        self._draw(time.perf_counter() - self.t0, end="\n")

    def line(self, now: float) -> str:
        filled = int(30 * self.done / max(self.total, 1))
        rate = self.tokens / now if now > 0 else 0.0
        return (f"\r{self.label} [{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total}"
                f"  {self.failed} failed  {rate:.1f} tok/s  {now:.0f} s ")  # fmt: skip

    def _draw(self, now: float, end: str = "") -> None:
        if not self.quiet:
            sys.stderr.write(self.line(now) + end)
            sys.stderr.flush()
