"""Bad models and settings give one-line errors a user can act on."""

from __future__ import annotations

import json

import pytest
import torch

from kvserve import LLM
from kvserve.engine.config_builder import build_engine_config
from kvserve.errors import ConfigError, ModelLoadError


def test_missing_model_path_names_it(tmp_path) -> None:
    with pytest.raises(ModelLoadError, match="no such file"):
        LLM(model=str(tmp_path / "nope"))


def test_unknown_architecture(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ModelLoadError, match="GPT2LMHeadModel"):
        LLM(model=str(tmp_path))


def test_corrupt_gguf(tmp_path) -> None:
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"GGUF" + b"\x00" * 10)
    with pytest.raises(ModelLoadError, match="broken.gguf"):
        LLM(model=str(path))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"dtype": "float8"}, "dtype must be one of"),
        ({"page_size": 12}, "power of two"),
        ({"max_running_requests": 0}, "must be positive"),
        ({"no_such_setting": 1}, "unknown engine setting"),
        ({"attention_backend": "magic"}, "unknown attention backend"),
        ({"kv_cache_dtype": "bfloat16", "device": "cpu"}, "does not match the model dtype"),
    ],
)
def test_bad_settings(settings, message) -> None:
    with pytest.raises(ConfigError, match=message):
        LLM(**settings)


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({}, None),
        ({"disable_overlap_schedule": True}, False),
        ({"enable_overlap_schedule": True}, True),
        ({"disable_overlap_schedule": False, "enable_overlap_schedule": False}, None),
        ({"async_scheduling": True}, True),  # vLLM's name
        ({"async_scheduling": False}, False),
    ],
)
def test_overlap_schedule_settings(settings, expected) -> None:
    assert build_engine_config(**settings).overlap_schedule is expected


@pytest.mark.parametrize(
    ("settings", "expected"),
    [({}, None), ({"disable_pdl": True}, False), ({"disable_pdl": False}, None)],
)
def test_pdl_settings(settings, expected) -> None:
    assert build_engine_config(**settings).enable_pdl is expected


def test_pdl_forced_on_a_cpu_is_a_config_error() -> None:
    from kvserve.engine.runner.model_runner import _resolve_pdl

    with pytest.raises(ConfigError, match="sm_90"):
        _resolve_pdl(True, torch.device("cpu"))
    assert _resolve_pdl(None, torch.device("cpu")) is False
