"""A circuit breaker per worker (sglang-router's --cb-* flags).

closed: requests flow; `failure_threshold` failures within `window_s` (counted from the first
failure of the run; a success resets the run) open it. open: the worker gets no requests for
`open_duration_s`, then half-open. half_open: requests flow again as trials; `success_threshold`
successes close it, one failure opens it again."""

from __future__ import annotations

import time
from collections.abc import Callable

from kvserve.router.config import BreakerConfig

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
STATE_CODES = {CLOSED: 0, OPEN: 1, HALF_OPEN: 2}


class CircuitBreaker:
    def __init__(self, config: BreakerConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config, self.clock = config, clock
        self._state = CLOSED
        self.failures = 0
        self.successes = 0
        self.first_failure_at = 0.0
        self.opened_at = 0.0
        self.transitions = 0

    @property
    def state(self) -> str:
        if self._state == OPEN and self.clock() - self.opened_at >= self.config.open_duration_s:
            self._move(HALF_OPEN)
        return self._state

    def allows(self) -> bool:
        return not self.config.enabled or self.state != OPEN

    def record_success(self) -> None:
        if self._state == HALF_OPEN:
            self.successes += 1
            if self.successes >= self.config.success_threshold:
                self._move(CLOSED)
        else:
            self.failures = 0

    def record_failure(self) -> None:
        if not self.config.enabled:
            return
        now = self.clock()
        if self.state == HALF_OPEN:
            self._open(now)
            return
        if self._state == OPEN:
            return
        if self.failures == 0 or now - self.first_failure_at > self.config.window_s:
            self.failures, self.first_failure_at = 0, now
        self.failures += 1
        if self.failures >= self.config.failure_threshold:
            self._open(now)

    def _open(self, now: float) -> None:
        self.opened_at = now
        self._move(OPEN)

    def _move(self, state: str) -> None:
        self._state, self.failures, self.successes = state, 0, 0
        self.transitions += 1
