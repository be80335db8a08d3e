"""The bounded queue: a slot limit, FIFO hand-over, 'full' and 'timed out' refusals."""

from __future__ import annotations

import asyncio

import pytest

from kvserve.router.admission import Admission, QueueFull, QueueTimeout
from kvserve.router.config import QueueConfig


def test_limit_queue_full_and_fifo_handover() -> None:
    async def scenario() -> list[str]:
        adm = Admission(QueueConfig(max_concurrent=1, size=2, timeout_s=30))
        order: list[str] = []
        await adm.acquire()  # the one slot

        async def waiter(name: str) -> None:
            await adm.acquire()
            order.append(name)
            adm.release()

        tasks = [asyncio.create_task(waiter(n)) for n in ("first", "second")]
        await asyncio.sleep(0)
        assert adm.depth == 2 and adm.running == 1
        with pytest.raises(QueueFull):
            await adm.acquire()
        adm.release()
        await asyncio.gather(*tasks)
        assert adm.running == 0 and adm.depth == 0
        return order

    assert asyncio.run(scenario()) == ["first", "second"]


def test_queue_timeout_and_a_cancelled_waiter_leave_no_trace() -> None:
    async def scenario() -> None:
        adm = Admission(QueueConfig(max_concurrent=1, size=5, timeout_s=0.05))
        await adm.acquire()
        with pytest.raises(QueueTimeout):
            await adm.acquire()
        task = asyncio.create_task(adm.acquire())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert adm.depth == 0
        adm.release()
        assert adm.running == 0

    asyncio.run(scenario())
