"""Settings the engine cannot honour are refused when the config is built, with a message that
says what to do: tensor parallelism, KV cache dtypes, a context longer than the model's."""

from __future__ import annotations

import argparse

import pytest

from kvserve import LLM, SamplingParams
from kvserve.config import (
    ALLOW_LONGER_CONTEXT_ENV,
    ModelConfig,
    check_context_length,
    rope_max_positions,
)
from kvserve.engine.config_builder import build_engine_config
from kvserve.engine.runner.kv_pool import SUPPORTED_DTYPES
from kvserve.errors import ConfigError
from kvserve.flags import add_flags, engine_settings


def _model(**fields: object) -> ModelConfig:
    shape = dict(
        architecture="LlamaForCausalLM", vocab_size=64, hidden_size=32, intermediate_size=64,
        num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16, max_position_embeddings=4096,
    )  # fmt: skip
    return ModelConfig(**{**shape, **fields})


def test_tensor_parallel_size_one_is_accepted(tiny_model_dir) -> None:
    path = str(tiny_model_dir("LlamaForCausalLM"))
    llm = LLM(model=path, tensor_parallel_size=1, device="cpu", max_total_tokens=256)
    assert llm.engine.config.tp == 1


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"tp": 0}, "must be at least 1"),
        ({"tensor_parallel_size": 4, "nnodes": 3}, "nnodes 3 must be at least 1 and divide tp 4"),
        ({"tp": 2, "nnodes": 2}, "needs dist_init_addr"),
        ({"tp": 2, "nnodes": 2, "node_rank": 2, "dist_init_addr": "h:1"}, "node_rank 2"),
        ({"tp": 2, "dist_init_addr": "nohostport"}, "must be host:port"),
    ],
)
def test_bad_tensor_parallel_settings_are_refused(settings, message) -> None:
    with pytest.raises(ConfigError, match=message):
        build_engine_config(**settings)


def test_the_tp_flag_reaches_the_config() -> None:
    parser = argparse.ArgumentParser()
    add_flags(parser)
    assert build_engine_config(**engine_settings(parser.parse_args([]))).tp == 1
    args = parser.parse_args(["--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", "1",
                              "--dist-init-addr", "10.0.0.1:5000"])  # fmt: skip
    config = build_engine_config(**engine_settings(args))
    assert (config.tp, config.nnodes, config.node_rank) == (2, 2, 1)
    assert config.dist_init_addr == "10.0.0.1:5000"


def test_kv_cache_dtype_is_checked_against_the_pool_when_the_config_is_built() -> None:
    assert "auto" in SUPPORTED_DTYPES
    with pytest.raises(ConfigError, match="supported: auto"):
        build_engine_config(kv_cache_dtype="fp8_e5m2")
    with pytest.raises(ConfigError, match="kept in the model dtype"):
        build_engine_config(kv_cache_dtype="bfloat16", device="cpu")  # model dtype float32
    with pytest.raises(ConfigError, match="kept in the model dtype"):
        build_engine_config(kv_cache_dtype="float16", dtype="bfloat16")
    assert build_engine_config(kv_cache_dtype="float32", device="cpu").model_dtype == "float32"
    assert build_engine_config(kv_cache_dtype="bfloat16", dtype="bfloat16").cache
    # device auto: the model dtype waits for the device, and the pool checks it then
    assert build_engine_config(kv_cache_dtype="bfloat16").model_dtype is None


def test_context_longer_than_the_model_is_refused(monkeypatch) -> None:
    monkeypatch.delenv(ALLOW_LONGER_CONTEXT_ENV, raising=False)
    model = _model()
    assert check_context_length(None, model) == 4096
    assert check_context_length(4096, model) == 4096
    with pytest.raises(
        ConfigError, match=f"longer than the model's 4096 .*{ALLOW_LONGER_CONTEXT_ENV}"
    ):
        check_context_length(32768, model)
    monkeypatch.setenv(ALLOW_LONGER_CONTEXT_ENV, "1")
    assert check_context_length(32768, model) == 32768


@pytest.mark.parametrize(
    ("scaling", "limit"),
    [
        (None, 4096),
        ({"rope_type": "linear", "factor": 2.0}, 8192),
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}, 16384),
        ({"rope_type": "yarn", "factor": 4.0}, 16384),
        # llama3 configs state the scaled length in max_position_embeddings already
        ({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 512}, 4096),
    ],
)
def test_rope_scaling_covers_a_longer_context(monkeypatch, scaling, limit) -> None:
    monkeypatch.delenv(ALLOW_LONGER_CONTEXT_ENV, raising=False)
    model = _model(rope_scaling=scaling)
    assert rope_max_positions(model) == limit
    assert check_context_length(limit, model) == limit
    with pytest.raises(ConfigError, match="lower --context-length"):
        check_context_length(limit + 1, model)


def test_the_engine_refuses_a_context_longer_than_the_model(tiny_model_dir, monkeypatch) -> None:
    monkeypatch.delenv(ALLOW_LONGER_CONTEXT_ENV, raising=False)
    path = str(tiny_model_dir("LlamaForCausalLM"))  # max_position_embeddings 4096
    with pytest.raises(ConfigError, match="context_length 8192 is longer"):
        LLM(model=path, context_length=8192, device="cpu", max_total_tokens=256)


def test_prefill_attention_backend_flag_and_choice(tiny_model_dir) -> None:
    """The flag reaches the config; ``auto`` on CPU keeps the torch backend's own prefill;
    asking for cuDNN where it cannot run is refused at start with the reason."""
    parser = argparse.ArgumentParser()
    add_flags(parser)
    args = parser.parse_args(["--prefill-attention-backend", "triton"])
    assert build_engine_config(**engine_settings(args)).prefill_attention_backend == "triton"
    with pytest.raises(ConfigError, match="unknown prefill attention backend 'flash'"):
        build_engine_config(prefill_attention_backend="flash")
    path = str(tiny_model_dir("LlamaForCausalLM"))
    llm = LLM(model=path, device="cpu", max_total_tokens=256)
    assert llm.engine.config.prefill_attention_backend == "auto"
    assert llm.generate([[1, 2, 3]])[0].outputs[0].token_ids
    with pytest.raises(ConfigError, match="cudnn needs the triton attention backend"):
        LLM(model=path, device="cpu", max_total_tokens=256, prefill_attention_backend="cudnn")


def test_cudnn_prefill_reasons(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Each reason ``auto`` falls back to the Triton kernel for, in one line. The GPU and the
    package do not exist here: an sm_90 device and a missing or broken package are stood in."""
    import logging
    import sys
    import types

    import torch

    from kvserve.layers.attention.backend import create_prefill_library
    from kvserve.layers.attention.cudnn_prefill import STANDALONE, cudnn_prefill_unavailable

    bf16, fp8 = torch.bfloat16, torch.float8_e4m3fn
    assert "CUDA" in cudnn_prefill_unavailable(torch.device("cpu"), bf16, bf16, 128)
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert "sm_90" in cudnn_prefill_unavailable(gpu, bf16, bf16, 128)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert "same dtype" in cudnn_prefill_unavailable(gpu, bf16, fp8, 128)
    assert "head_dim 96" in cudnn_prefill_unavailable(gpu, bf16, bf16, 96)
    monkeypatch.setitem(sys.modules, "cudnn", None)  # import cudnn raises ImportError
    assert "not installed" in cudnn_prefill_unavailable(gpu, bf16, bf16, 128)
    # the engine's auto choice falls back to the Triton kernel, and says so as a warning
    with caplog.at_level(logging.INFO, logger="kvserve.layers.attention.backend"):
        assert create_prefill_library("auto", "triton", gpu, bf16, bf16, 128, STANDALONE) is None
        assert create_prefill_library("auto", "triton", gpu, bf16, fp8, 128, STANDALONE) is None
    levels = [(r.levelname, "not installed" in r.getMessage()) for r in caplog.records]
    assert levels == [("WARNING", True), ("INFO", False)]

    def no_library() -> int:
        raise OSError("libcudnn.so.9: cannot open shared object file")

    broken = types.ModuleType("cudnn")
    broken.backend_version = no_library
    monkeypatch.setitem(sys.modules, "cudnn", broken)
    reason = cudnn_prefill_unavailable(gpu, bf16, bf16, 128)
    assert reason.startswith("nvidia-cudnn-frontend does not load (OSError: libcudnn.so.9")
    old = types.ModuleType("cudnn")
    old.backend_version = lambda: 90100
    monkeypatch.setitem(sys.modules, "cudnn", old)
    assert "older than 9.5" in cudnn_prefill_unavailable(gpu, bf16, bf16, 128)


def test_a_sliding_window_caps_the_context(caplog) -> None:
    """kvserve has no windowed attention: a model with a window of W tokens is served W tokens
    at most (its own length is cut, with a warning; a longer one asked for is refused)."""
    model = _model(sliding_window=1024)
    with caplog.at_level("WARNING", logger="kvserve.config"):
        assert check_context_length(None, model) == 1024
    assert "sliding window of 1024 tokens" in caplog.text
    assert check_context_length(512, model) == 512
    with pytest.raises(ConfigError, match="sliding attention window of 1024 tokens.* 1024 or less"):
        check_context_length(2048, model)
    assert check_context_length(None, _model(sliding_window=8192)) == 4096


@pytest.mark.parametrize(
    ("arch", "fields", "window"),
    [
        ("MistralForCausalLM", {}, 4096),  # transformers' default when the key is absent
        ("MistralForCausalLM", {"sliding_window": None}, None),
        ("MistralForCausalLM", {"sliding_window": 2048}, 2048),
        ("LlamaForCausalLM", {}, None),
        ("Qwen2ForCausalLM", {"use_sliding_window": False, "sliding_window": 4096}, None),
        ("Qwen2ForCausalLM", {"use_sliding_window": True, "sliding_window": 4096,
                              "max_window_layers": 28}, None),  # from layer 28 of 2
        ("Qwen2ForCausalLM", {"use_sliding_window": True, "sliding_window": 4096,
                              "max_window_layers": 1}, 4096),
        ("Qwen3ForCausalLM", {"sliding_window": 512,
                              "layer_types": ["full_attention", "sliding_attention"]}, 512),
        ("Qwen3ForCausalLM", {"sliding_window": 512,
                              "layer_types": ["full_attention", "full_attention"]}, None),
    ],
)  # fmt: skip
def test_the_sliding_window_is_read_from_the_config(arch, fields, window) -> None:
    from kvserve.loader.hf_config import hf_config_to_model_config

    data = {
        "architectures": [arch], "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, **fields,
    }  # fmt: skip
    assert hf_config_to_model_config(data).sliding_window == window


def test_a_windowed_model_is_served_within_its_window(tiny_model_dir) -> None:
    """A tiny Mistral with a 64-token window: served 64 tokens of context, where its greedy
    tokens are transformers' (whose attention is windowed); longer is refused at start."""
    from model_factory import hf_greedy

    path = tiny_model_dir("MistralForCausalLM", sliding_window=64)
    llm = LLM(model=str(path), device="cpu", max_total_tokens=256)
    assert llm.engine.context_length == 64
    prompt = list(range(5, 59))
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    assert llm.generate([prompt], greedy)[0].outputs[0].token_ids == hf_greedy(path, prompt, 10)
    with pytest.raises(ConfigError, match="sliding attention window of 64 tokens"):
        LLM(model=str(path), context_length=128, device="cpu", max_total_tokens=256)
