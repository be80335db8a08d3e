"""The FP4 linear method on the quant seam: each checkpoint layout's tensors land in the packed
layout shard by shard (a merged q/k/v keeps each shard's own per-tensor scale), online
quantization, bad tensors refused by name, and ``--load-format dummy`` through the engine."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kvserve.errors import ModelLoadError
from kvserve.kernels.fp4_reference import dequantize_fp4
from kvserve.layers.linear import Linear
from kvserve.quant.checkpoint_config import read_checkpoint_config
from kvserve.quant.mxfp4 import quantize_mxfp4
from kvserve.quant.nvfp4 import quantize_nvfp4
from kvserve.quant.registry import QuantConfig, linear_method, resolve

SHARDS = [32, 16, 16]  # a q/k/v-like merged layer, K = 64


def layer(scheme: str, layout: str) -> Linear:
    method = linear_method(QuantConfig(scheme, layout, "test"), ["l.q", "l.k", "l.v"])
    return Linear(64, SHARDS, False, torch.float32, method, "l.qkv_proj")


def shard_weights() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    # very different magnitudes per shard: one shared per-tensor scale would crush the small one
    return [torch.randn(n, 64, generator=gen) * s for n, s in zip(SHARDS, (1.0, 0.01, 30.0))]


def nvfp4_tensors(layout: str, w: torch.Tensor) -> dict[str, torch.Tensor]:
    q = quantize_nvfp4(w)
    per_tensor = q.row_scale[:1].reshape(())
    if layout == "modelopt":
        return {
            "weight": q.packed,
            "weight_scale": q.block_scale,
            "weight_scale_2": per_tensor,
            "input_scale": torch.tensor(0.5),
        }
    return {
        "weight_packed": q.packed,
        "weight_scale": q.block_scale,
        "weight_global_scale": (1 / per_tensor).reshape(1),
    }


def mxfp4_tensors(layout: str, w: torch.Tensor) -> dict[str, torch.Tensor]:
    q = quantize_mxfp4(w)
    if layout == "mxfp4":
        return {
            "weight_blocks": q.packed.reshape(w.shape[0], -1, 16),
            "weight_scales": q.block_scale,
        }
    name = "weight" if layout == "modelopt" else "weight_packed"
    return {name: q.packed, "weight_scale": q.block_scale}


CASES = [
    ("nvfp4", "modelopt", nvfp4_tensors, quantize_nvfp4),
    ("nvfp4", "compressed-tensors", nvfp4_tensors, quantize_nvfp4),
    ("mxfp4", "mxfp4", mxfp4_tensors, quantize_mxfp4),
    ("mxfp4", "compressed-tensors", mxfp4_tensors, quantize_mxfp4),
    ("mxfp4", "modelopt", mxfp4_tensors, quantize_mxfp4),
]


@pytest.mark.parametrize(("scheme", "layout", "tensors", "quantize"), CASES)
def test_checkpoint_layouts_load_shard_by_shard(scheme, layout, tensors, quantize) -> None:
    lin = layer(scheme, layout)
    weights = shard_weights()
    for shard, w in enumerate(weights):
        for name, t in tensors(layout, w).items():
            lin.load_shard(name, t, shard)
    assert lin.missing() == []
    lin.finish_loading()
    expected = torch.cat([dequantize_fp4(*quantize(w)) for w in weights])
    x = torch.randn(5, 64)
    torch.testing.assert_close(lin(x), F.linear(x, expected), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scheme", ["nvfp4", "mxfp4"])
def test_online_quantization_keeps_each_shard_close(scheme: str) -> None:
    lin = layer(scheme, "online")
    assert lin.missing() == [f"l.qkv_proj.weight[{s}]" for s in range(3)]
    weights = shard_weights()
    for shard, w in enumerate(weights):
        lin.load_shard("weight", w, shard)
    lin.finish_loading()
    x = torch.randn(7, 64, generator=torch.Generator().manual_seed(0))  # not the global RNG
    out = lin(x)
    offsets = [0, 32, 48, 64]
    bound = 0.12 if scheme == "nvfp4" else 0.2  # E2M1 on Gaussian weights: ~8% / ~13%
    for i, w in enumerate(weights):
        ref = x @ w.T
        got = out[:, offsets[i] : offsets[i + 1]]
        assert (got - ref).norm() / ref.norm() < bound
    assert not any(p.dtype.is_floating_point and p.numel() == 64 * 64 for p in lin.parameters())


def test_foreign_or_malformed_tensors_are_refused_by_name() -> None:
    lin = layer("nvfp4", "modelopt")
    with pytest.raises(ModelLoadError, match="weight_packed.*has no place in a nvfp4"):
        lin.load_shard("weight_packed", torch.zeros(32, 32, dtype=torch.uint8), 0)
    with pytest.raises(ModelLoadError, match="packed FP4 weights are uint8"):
        lin.load_shard("weight", torch.zeros(32, 32), 0)
    with pytest.raises(ModelLoadError, match="checkpoint shape"):
        lin.load_shard("weight", torch.zeros(32, 16, dtype=torch.uint8), 0)
    with pytest.raises(ModelLoadError, match="multiple of 32"):
        Linear(48, [16], False, torch.float32, linear_method(resolve(None, "mxfp4"), ["m"]), "m")


def test_checkpoint_configs_resolve_to_fp4_layouts() -> None:
    modelopt = {"quantization": {"quant_algo": "NVFP4", "exclude_modules": ["lm_head"]}}
    ct = {"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized"}
    gptoss = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    assert (read_checkpoint_config(modelopt).scheme, resolve(modelopt).layout) == (
        "nvfp4",
        "modelopt",
    )
    assert (resolve(ct).scheme, resolve(ct).layout) == ("mxfp4", "compressed-tensors")
    config = resolve(gptoss)
    assert config.ignores("model.layers.3.self_attn.q_proj")
    assert not config.ignores("model.layers.3.mlp.gate_proj")


@pytest.mark.parametrize("scheme", ["nvfp4", "mxfp4"])
def test_dummy_load_runs_the_engine(scheme: str, tiny_model_dir) -> None:
    from kvserve.engine.core.sampling_params import SamplingParams
    from kvserve.engine.llm import LLM

    path = tiny_model_dir("LlamaForCausalLM")
    llm = LLM(str(path), device="cpu", load_format="dummy", quantization=scheme)
    linear = llm.engine.runner.model.model.layers[0].mlp.down_proj
    assert linear.weight_packed.dtype == torch.uint8
    assert (
        0
        < dequantize_fp4(linear.weight_packed, linear.weight_scale, linear.weight_row_scale)
        .abs()
        .max()
        < 0.05
    )
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4
