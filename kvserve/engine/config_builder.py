"""Flat keyword settings (offline API kwargs, CLI flags) -> the frozen config tree."""

from __future__ import annotations

import dataclasses
from typing import Any

from kvserve.config import CacheConfig, DisaggConfig, EngineConfig, SchedulerConfig
from kvserve.errors import ConfigError

_SECTIONS = {"cache": CacheConfig, "scheduler": SchedulerConfig, "disagg": DisaggConfig}
# vLLM spellings the field uses -> ours
ALIASES = {
    "tensor_parallel_size": "tp",
    "gpu_memory_utilization": "mem_fraction_static",
    "max_num_seqs": "max_running_requests",
    "max_model_len": "context_length",
    "block_size": "page_size",
    "async_scheduling": "overlap_schedule",
}
# CLI switches that turn a setting off -> the setting
_OFF_SWITCHES = {
    "disable_prefix_cache": "enable_prefix_cache",
    "disable_overlap_schedule": "overlap_schedule",
    "disable_pdl": "enable_pdl",
}


def build_engine_config(model: str | None = None, **settings: Any) -> EngineConfig:
    settings = {ALIASES.get(k, k): v for k, v in settings.items() if v is not None}
    for switch, field_name in _OFF_SWITCHES.items():  # a switch: False means "not given"
        if settings.pop(switch, False):
            settings[field_name] = False
    if settings.pop("enable_overlap_schedule", False):
        settings["overlap_schedule"] = True
    sections: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
    top: dict[str, Any] = {}
    top_fields = {f.name for f in dataclasses.fields(EngineConfig)} - set(_SECTIONS)
    for key, value in settings.items():
        section = next(
            (n for n, cls in _SECTIONS.items() if key in {f.name for f in dataclasses.fields(cls)}),
            None,
        )
        if section is not None:
            sections[section][key] = value
        elif key in top_fields:
            top[key] = value
        else:
            raise ConfigError(f"unknown engine setting {key!r}")
    return EngineConfig(
        model=model,
        cache=CacheConfig(**sections["cache"]),
        scheduler=SchedulerConfig(**sections["scheduler"]),
        disagg=DisaggConfig(**sections["disagg"]),
        **top,
    )
