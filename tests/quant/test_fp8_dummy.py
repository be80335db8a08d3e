"""``load_format="dummy"`` with each FP8 layout: random FP8 weights and scales in the
layout's own shapes, from a config.json alone; and the refusals at start."""

from __future__ import annotations

import json

import pytest
import torch

from kvserve import LLM, SamplingParams
from kvserve.errors import ConfigError, ModelLoadError
from kvserve.layers.linear import Linear
from kvserve.quant.registry import check_device, resolve

TINY = {
    "architectures": ["LlamaForCausalLM"], "vocab_size": 512, "hidden_size": 128,
    "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 512, "eos_token_id": 0,
}  # fmt: skip
LAYOUTS = {
    "online": (None, {"quantization": "fp8"}, (384,)),
    "modelopt": ({"quant_method": "modelopt", "quant_algo": "FP8"}, {}, (1,)),
    "block": ({"quant_method": "fp8", "weight_block_size": [128, 128]}, {}, (3, 1)),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_dummy_weights_in_each_fp8_layout(layout: str, tmp_path) -> None:  # noqa: ANN001
    qc, settings, qkv_scale_shape = LAYOUTS[layout]
    (tmp_path / "config.json").write_text(json.dumps({**TINY, "quantization_config": qc}))
    llm = LLM(str(tmp_path), device="cpu", load_format="dummy", max_total_tokens=2048, **settings)
    core = llm.engine
    qkv = core.runner.model.model.layers[0].self_attn.qkv_proj
    assert qkv.weight.dtype == torch.float8_e4m3fn and qkv.weight.shape == (384, 128)
    assert tuple(qkv.weight_scale.shape) == qkv_scale_shape
    assert all(
        torch.isfinite(m.weight.float()).all()
        for m in core.runner.model.modules()
        if isinstance(m, Linear)
    )
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    first = llm.generate([[5, 6, 7]], params)[0].token_ids
    assert len(first) == 6 and first == llm.generate([[5, 6, 7]], params)[0].token_ids


def test_block_scales_must_not_straddle_merged_shards(tmp_path) -> None:  # noqa: ANN001
    qc = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    config = {**TINY, "num_key_value_heads": 1, "quantization_config": qc}  # k, v: 64 rows
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="do not start on 128-row weight-scale blocks"):
        LLM(str(tmp_path), device="cpu", load_format="dummy", max_total_tokens=2048)


def test_fp8_is_refused_on_a_gpu_without_fp8_tensor_cores() -> None:
    with pytest.raises(ConfigError, match=r"fp8 .* needs compute capability 8\.9\+.* sm_80"):
        check_device(resolve(None, "fp8"), "cuda", (8, 0))
    check_device(resolve(None, "fp8"), "cuda", (9, 0))
    check_device(resolve(None, "fp8"), "cpu", None)


def test_fp8_variant_kvserve_does_not_run_is_refused_naming_it() -> None:
    qc = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "static"}
    with pytest.raises(ConfigError, match="block-wise weights with static activations"):
        resolve(qc)
