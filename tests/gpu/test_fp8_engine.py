"""FP8 in the engine on a GPU: online --quantization fp8 and the block-wise layout run through
CUDA graphs and give the tokens eager runs give; llmcompressor checkpoints give the logits of
the CPU reference path."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from kvserve.engine.config_builder import build_engine_config
from kvserve.engine.engine_core import EngineCore

pytestmark = pytest.mark.gpu
pytest.importorskip("triton")

from test_engine_gpu import _greedy, _tiny_checkpoint  # noqa: E402

sys.path.insert(0, str(Path(__file__).parents[1] / "quant"))
from fp8_helpers import FIXTURES, cpu_engine, norm_quant, prefill_logits  # noqa: E402

BLOCK_FP8 = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}


@pytest.fixture(autouse=True)
def _needs_fp8() -> None:
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 tensor cores need sm_89+")


def _block_checkpoint(tmp_path) -> str:  # noqa: ANN001
    """A tiny Llama whose projections are 128-multiples, saved in the block-wise FP8 layout
    (weight fp8 + weight_scale_inv per 128x128 block), as Qwen3-FP8 ships."""
    from safetensors.torch import load_file, save_file

    from kvserve.quant.fp8_weights import quantize_weight

    path = tmp_path / "ckpt"
    _tiny_checkpoint("LlamaForCausalLM", path)
    tensors = load_file(str(path / "model.safetensors"))
    out = {}
    for name, t in tensors.items():
        if name.endswith("proj.weight"):
            q, s = quantize_weight(t, "block", (128, 128))
            out[name], out[name + "_scale_inv"] = q, s
        else:
            out[name] = t
    save_file(out, str(path / "model.safetensors"))
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = BLOCK_FP8
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize("layout", ["online", "block"])
def test_fp8_graphs_match_eager(layout: str, tmp_path) -> None:
    if layout == "online":
        path, extra = _tiny_checkpoint("LlamaForCausalLM", tmp_path), {"quantization": "fp8"}
    else:
        path, extra = _block_checkpoint(tmp_path), {}
    settings = dict(dtype="float32", max_total_tokens=8192, **extra)
    graphs = EngineCore(build_engine_config(path, device="cuda", **settings))
    eager = EngineCore(build_engine_config(path, device="cuda", enforce_eager=True, **settings))
    assert graphs.runner.graphs is not None
    assert _greedy(graphs) == _greedy(eager)


@pytest.mark.parametrize("layout", ["fp8_dynamic", "fp8_block", "fp8_static"])
def test_fp8_gpu_logits_match_the_cpu_reference(layout: str) -> None:
    """The llmcompressor checkpoints (tests/fixtures/quant) through FP8 tensor cores against
    the CPU path (itself within 5e-7 of compressed-tensors for the dynamic layouts). Greedy
    tokens are no test here: the tiny random models above are chaotic under FP8 rounding (a
    1e-6 weight perturbation moves 44% of their greedy tokens on the CPU alone)."""
    prompt = list(range(3, 60)) + [200, 17, 17, 90]
    path = FIXTURES / layout
    gpu = prefill_logits(EngineCore(build_engine_config(
        str(path), device="cuda", dtype="float32", max_total_tokens=4096)), prompt)  # fmt: skip
    cpu = prefill_logits(cpu_engine(path), prompt)
    err = (gpu.cpu() - cpu).abs().max() / cpu.abs().max()
    assert err < 0.04, err  # FP8 activations, fast accumulation: 2.2-2.4% seen on the H200
    assert (gpu.cpu().argmax(-1) == cpu.argmax(-1)).float().mean() > 0.95


def _dummy_llama(tmp_path, quantization_config: dict | None) -> tuple[str, dict]:  # noqa: ANN001
    """A 2-layer Llama config whose projections are 128-multiples, for dummy FP8 weights:
    online (no ``quantization_config``) or in the checkpoint format it names. Returns the
    directory and the engine settings it needs."""
    config = {
        "architectures": ["LlamaForCausalLM"], "vocab_size": 1024, "hidden_size": 256,
        "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 2048,
        "eos_token_id": 0,
    }  # fmt: skip
    if quantization_config is not None:
        config["quantization_config"] = quantization_config
    (tmp_path / "config.json").write_text(json.dumps(config))
    extra = {"quantization": "fp8"} if quantization_config is None else {}
    return str(tmp_path), dict(dtype="bfloat16", load_format="dummy", **extra)


@pytest.mark.parametrize("qc", [None, BLOCK_FP8, {"quant_method": "modelopt", "quant_algo": "FP8"}])
def test_dummy_fp8_bf16_runs_under_graphs(qc, tmp_path) -> None:  # noqa: ANN001
    path, settings = _dummy_llama(tmp_path, qc)
    core = EngineCore(build_engine_config(path, device="cuda", max_total_tokens=8192, **settings))
    assert core.runner.graphs is not None
    weights = [p for n, p in core.runner.model.named_parameters() if n.endswith("proj.weight")]
    assert weights and all(p.dtype == torch.float8_e4m3fn for p in weights)
    out = _greedy(core, 8)
    assert all(len(t) == 8 for t in out)


@pytest.mark.parametrize("qc", [None, BLOCK_FP8])
def test_the_norm_writing_fp8_gives_the_same_tokens(qc, tmp_path) -> None:  # noqa: ANN001
    """``KVSERVE_FP8_NORM_QUANT`` at 0 and 1: 48 and 100 requests at once (the tensor-core
    kernel with x quantized first, then cuBLAS or the block GEMM) under CUDA graphs, and their
    prefills: the same greedy tokens (the two paths give the same bits:
    ``test_rmsnorm_fp8.py``)."""
    path, settings = _dummy_llama(tmp_path, qc)
    tokens = {}
    for value in ("0", "1"):
        with norm_quant(value):
            core = EngineCore(build_engine_config(
                path, device="cuda", max_total_tokens=32768, **settings
            ))  # fmt: skip
            assert core.runner.graphs is not None
            for batch in (48, 100):
                prompts = [[(7 * i + j) % 1000 + 2 for j in range(5 + i % 13)]
                           for i in range(batch)]  # fmt: skip
                tokens[value, batch] = _greedy(core, 6, prompts, min_width=batch)
            del core
            torch.cuda.empty_cache()
    assert tokens["0", 48] == tokens["1", 48] and tokens["0", 100] == tokens["1", 100]
