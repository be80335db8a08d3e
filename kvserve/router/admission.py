"""The bounded queue: at most `max_concurrent` requests are forwarded at once; up to `size`
more wait in FIFO order; a request that finds the queue full is refused (429), one that waits
longer than `timeout_s` is refused (503). A finishing request hands its slot straight to the
first waiter, so the count never overshoots."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque

from kvserve.router.config import QueueConfig


class QueueFull(Exception):
    pass


class QueueTimeout(Exception):
    pass


class Admission:
    def __init__(self, config: QueueConfig) -> None:
        self.config = config
        self.running = 0
        self.waiters: deque[asyncio.Future[None]] = deque()

    @property
    def depth(self) -> int:
        return len(self.waiters)

    async def acquire(self) -> float:
        """Takes a slot; returns the seconds spent queued."""
        if self.running < self.config.max_concurrent and not self.waiters:
            self.running += 1
            return 0.0
        if len(self.waiters) >= self.config.size:
            raise QueueFull
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        fut: asyncio.Future[None] = loop.create_future()
        self.waiters.append(fut)
        timer = loop.call_later(self.config.timeout_s, self._expire, fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.release()  # the slot was handed over just as the client left
            else:
                self._forget(fut)
            raise
        finally:
            timer.cancel()
        return time.perf_counter() - start

    def _expire(self, fut: asyncio.Future[None]) -> None:
        if not fut.done():
            self._forget(fut)
            fut.set_exception(QueueTimeout())

    def _forget(self, fut: asyncio.Future[None]) -> None:
        with contextlib.suppress(ValueError):
            self.waiters.remove(fut)

    def release(self) -> None:
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # the slot passes on; `running` stays
                return
        self.running -= 1
