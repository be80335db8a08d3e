"""The circuit breaker's states on a controlled clock."""

from __future__ import annotations

from kvserve.router.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker
from kvserve.router.config import BreakerConfig


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def breaker(**kw: object) -> tuple[CircuitBreaker, Clock]:
    clock = Clock()
    cfg = BreakerConfig(**{"failure_threshold": 3, "success_threshold": 2,  # type: ignore[arg-type]
                           "open_duration_s": 10.0, "window_s": 5.0, **kw})  # fmt: skip
    return CircuitBreaker(cfg, clock), clock


def test_opens_after_threshold_failures_then_half_opens_and_closes() -> None:
    b, clock = breaker()
    for _ in range(3):
        assert b.allows()
        b.record_failure()
    assert b.state == OPEN and not b.allows()
    clock.now += 10.0
    assert b.state == HALF_OPEN and b.allows()
    b.record_success()
    assert b.state == HALF_OPEN
    b.record_success()
    assert b.state == CLOSED


def test_a_failure_while_half_open_opens_again() -> None:
    b, clock = breaker()
    for _ in range(3):
        b.record_failure()
    clock.now += 10.0
    assert b.state == HALF_OPEN
    b.record_failure()
    assert b.state == OPEN
    clock.now += 9.0
    assert not b.allows()


def test_failures_outside_the_window_and_successes_reset_the_count() -> None:
    b, clock = breaker()
    b.record_failure()
    b.record_failure()
    clock.now += 6.0  # past the 5 s window: the run starts over
    b.record_failure()
    b.record_failure()
    assert b.state == CLOSED
    b.record_success()
    b.record_failure()
    b.record_failure()
    assert b.state == CLOSED
    b.record_failure()
    assert b.state == OPEN


def test_disabled_breaker_never_opens() -> None:
    b, _ = breaker(enabled=False)
    for _ in range(10):
        b.record_failure()
    assert b.allows() and b.state == CLOSED
