"""A plain progress line on stderr: requests done / total, failures, current output tok/s."""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field


@dataclass
class Progress:
    total: int | None  # None: a --duration run
    duration_s: float | None = None
    quiet: bool = False
    done: int = 0
    failed: int = 0
    chunks: int = 0  # content chunks seen so far (~ output tokens)
    _marks: list[tuple[float, int]] = field(default_factory=list)

    def line(self, now: float) -> str:
        self._marks = [m for m in self._marks if now - m[0] <= 5.0] + [(now, self.chunks)]
        (t_a, c_a), (t_b, c_b) = self._marks[0], self._marks[-1]
        rate = (c_b - c_a) / (t_b - t_a) if t_b > t_a else 0.0
        if self.total:
            frac = min(self.done / self.total, 1.0)
            count = f"{self.done}/{self.total} req"
        else:
            frac = min(now / self.duration_s, 1.0) if self.duration_s else 0.0
            count = f"{self.done} req"
        bar = "#" * int(frac * 30) + "." * (30 - int(frac * 30))
        return f"\r[{bar}] {count}  {self.failed} failed  {rate:8.1f} tok/s "

    async def run(self, t0: float, period_s: float = 0.5) -> None:
        if self.quiet:
            return
        try:
            while True:
                sys.stderr.write(self.line(time.perf_counter() - t0))
                sys.stderr.flush()
                await asyncio.sleep(period_s)
        except asyncio.CancelledError:
            sys.stderr.write(self.line(time.perf_counter() - t0) + "\n")
            sys.stderr.flush()
            raise
