"""Preflight plans with the engine's own facts: the architectures the model registry serves and
the KV bytes per token the KV pool allocates."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from kvserve.config import ModelConfig
from kvserve.engine.runner.kv_cache_sizing import kv_bytes_per_token as engine_kv_bytes
from kvserve.engine.runner.kv_pool import KVPool, PageGeometry
from kvserve.loader.architectures import SUPPORTED_ARCHITECTURES as LOADER_ARCHITECTURES
from kvserve.models.registry import SUPPORTED_ARCHITECTURES, model_class
from kvserve.preflight.capacity import kv_bytes_per_token as preflight_kv_bytes
from kvserve.preflight.checks.model import check_architecture
from kvserve.preflight.probes.model_files import probe_model
from kvserve.preflight.result import Status


def _checkpoint(tmp_path: Path, architecture: str) -> Path:
    cfg = {
        "architectures": [architecture], "num_hidden_layers": 2, "num_attention_heads": 8,
        "num_key_value_heads": 2, "hidden_size": 64, "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
    }  # fmt: skip
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    save_file({"a": torch.zeros(4, 4)}, str(tmp_path / "model.safetensors"))
    return tmp_path


def test_every_architecture_the_engine_serves_passes_preflight(tmp_path: Path) -> None:
    assert LOADER_ARCHITECTURES is SUPPORTED_ARCHITECTURES
    assert "MistralForCausalLM" in SUPPORTED_ARCHITECTURES
    for arch in SUPPORTED_ARCHITECTURES:
        model_class(arch)  # the engine has a class for it
        model = probe_model(_checkpoint(tmp_path / arch, arch))
        assert check_architecture(model).status is Status.PASS, arch
    unknown = probe_model(_checkpoint(tmp_path / "gpt2", "GPT2LMHeadModel"))
    assert check_architecture(unknown).status is Status.FAIL


def test_preflight_and_the_engine_count_kv_bytes_alike() -> None:
    cfg = ModelConfig(
        architecture="LlamaForCausalLM", vocab_size=256, hidden_size=4096,
        intermediate_size=14336, num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
    )  # fmt: skip
    pool = KVPool.allocate(PageGeometry.of(cfg, 1, 1), torch.bfloat16, torch.device("meta"))
    expected = 2 * 32 * 8 * 128 * 2  # Llama-3-8B in bf16: 128 KiB per token
    assert engine_kv_bytes(cfg, torch.bfloat16) == pool.bytes_per_token == expected
    assert preflight_kv_bytes(32, 8, 128, 2, tp=1) == expected
