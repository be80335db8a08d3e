"""The one place that turns ``--disaggregation-mode`` into the engine core's hook."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvserve.config import EngineConfig
from kvserve.disagg.hooks import EngineHook

if TYPE_CHECKING:
    from kvserve.engine.engine_core import EngineCore


def make_engine_hook(config: EngineConfig, engine: EngineCore) -> EngineHook | None:
    mode = config.disagg.disaggregation_mode
    if mode == "prefill":
        from kvserve.disagg.prefill_side import PrefillSide

        return PrefillSide(config.disagg, engine.runner.kv, engine.context_length)
    if mode == "decode":
        from kvserve.disagg.decode_side import DecodeSide

        return DecodeSide(config.disagg, engine)
    return None
