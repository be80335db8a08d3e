"""Shared by the FP8 checkpoint tests: the llmcompressor fixtures, a CPU engine on one, and
its logits for a prompt through the engine's own path (scheduler plan -> paged attention)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import torch

from kvserve.engine.config_builder import build_engine_config
from kvserve.engine.core.sampling_params import SamplingParams
from kvserve.engine.engine_core import EngineCore
from kvserve.engine.runner.input_batch import build_model_inputs
from kvserve.models.forward_context import ForwardContext
from kvserve.quant.fp8_method import NORM_QUANT_ENV, norm_quant_enabled

FIXTURES = Path(__file__).parents[1] / "fixtures" / "quant"


def fixture_config(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name / "config.json").read_text())["quantization_config"]


def cpu_engine(path: str | Path, **settings: Any) -> EngineCore:
    config = build_engine_config(str(path), device="cpu", max_total_tokens=2048, **settings)
    return EngineCore(config)


def step_logits(core: EngineCore) -> tuple[Any, torch.Tensor]:
    """The scheduler's next step and the logits of its every row: the engine's own plan, paged
    KV cache and attention backend, with the model called directly (eager)."""
    plan = core.scheduler.schedule()
    inputs = build_model_inputs(plan, core.runner.page_size, core.device)
    ctx = ForwardContext(inputs.meta, core.runner.kv, core.runner.backend)
    with torch.inference_mode():
        hidden = core.runner.model(inputs.token_ids, inputs.positions, ctx)
        return plan, core.runner.model.compute_logits(hidden)


def prefill_logits(core: EngineCore, ids: list[int]) -> torch.Tensor:
    """float32 logits of every prompt position, one prefill step."""
    core.add_request("logits", ids, SamplingParams(temperature=0, max_tokens=1))
    plan, logits = step_logits(core)
    core.scheduler.update(plan, {"logits": int(logits[-1].argmax())})
    core.check_integrity()
    return logits


@contextmanager
def cached_setting(name: str, value: str, reader: Callable[[], object]) -> Iterator[None]:
    """Setting ``name`` at ``value`` inside the block; ``reader`` (it reads the setting once
    and caches it) has its cache cleared on the way in and out."""
    before = os.environ.get(name)
    os.environ[name] = value
    reader.cache_clear()  # type: ignore[attr-defined]
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name)
        else:
            os.environ[name] = before
        reader.cache_clear()  # type: ignore[attr-defined]


def norm_quant(value: str) -> AbstractContextManager[None]:
    """``KVSERVE_FP8_NORM_QUANT`` at ``value`` inside the block."""
    return cached_setting(NORM_QUANT_ENV, value, norm_quant_enabled)
