"""Assertions every engine test ends with."""

from __future__ import annotations

from kvserve.engine.engine_core import EngineCore


def assert_engine_clean(engine: EngineCore) -> None:
    """Integrity holds and, with no request left, no page is held (cached pages may stay)."""
    engine.check_integrity()
    assert not engine.has_unfinished()
    assert engine.kv.usage == 0, "a KV page is still held after every request finished"
