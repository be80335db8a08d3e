"""Tiny random MoE models quantized at load (``quantization="nvfp4" | "mxfp4" | "fp8"``): every
linear and every expert goes low-bit. The reference is transformers on the same checkpoint
with each of those weights replaced by its quantize-dequantize (kvserve's quantizers, whose
formats tests/quant checks against compressed-tensors and torchao), run in fp32."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from model_factory import MOE_TINY

from kvserve import LLM, SamplingParams
from kvserve.errors import ConfigError
from kvserve.kernels.fp4_reference import dequantize_fp4
from kvserve.kernels.fp8_gemm import dequantize_fp8_weight
from kvserve.kernels.fused_moe_fp8 import FP8_MOE_GEMV_ENV, fp8_moe_gemv_enabled
from kvserve.kernels.fused_moe_half_gemv import HALF_MOE_GEMV_ENV, half_moe_gemv_enabled
from kvserve.kernels.word_gemv import GATED_GEMV_ENV, gated_gemv_enabled
from kvserve.quant.fp8_weights import quantize_weight
from kvserve.quant.mxfp4 import quantize_mxfp4
from kvserve.quant.nvfp4 import quantize_nvfp4

PROMPTS = [list(range(5, 36)), [7, 300, 1000, 42] * 6]
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
CASES = [
    ("Qwen3MoeForCausalLM", "nvfp4"),
    ("Qwen3MoeForCausalLM", "mxfp4"),
    ("Glm4MoeForCausalLM", "nvfp4"),
    ("Qwen3MoeForCausalLM", "fp8"),
    ("MixtralForCausalLM", "mxfp4"),
]
# the projections kvserve quantizes, as checkpoints name them (Mixtral's experts: w1, w2, w3)
PROJECTION = re.compile(r"(_proj|\.w[123])\.weight$")


def _fake_quantized(w: torch.Tensor, scheme: str) -> torch.Tensor:
    if scheme == "fp8":
        q, scale = quantize_weight(w, "channel")
        return dequantize_fp8_weight(q, scale)
    return dequantize_fp4(*(quantize_nvfp4 if scheme == "nvfp4" else quantize_mxfp4)(w))


def _reference_dir(src: Path, scheme: str, out: Path) -> Path:
    """``src`` with every projection weight (attention, dense MLP, shared and routed experts;
    not the router, embeddings or LM head) fake-quantized, saved in fp32."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(src / "model.safetensors"))
    dense = {
        n: _fake_quantized(t, scheme) if PROJECTION.search(n) else t.float()
        for n, t in tensors.items()
    }
    out.mkdir()
    save_file(dense, str(out / "model.safetensors"))
    config = json.loads((src / "config.json").read_text()) | {"dtype": "float32"}
    (out / "config.json").write_text(json.dumps(config))
    for name in src.iterdir():
        if name.suffix in (".jinja", ".txt") or "token" in name.name:
            shutil.copy(name, out / name.name)
    return out


@pytest.mark.parametrize(("arch", "scheme"), CASES, ids=[f"{a[:4]}-{s}" for a, s in CASES])
def test_online_quantized_moe_matches_its_fake_quantized_reference(
    arch: str, scheme: str, tiny_model_dir, tmp_path
) -> None:  # noqa: ANN001
    import transformers

    src = tiny_model_dir(arch, **MOE_TINY[arch])
    llm = LLM(model=str(src), device="cpu", quantization=scheme, max_total_tokens=1024)
    moe = next(m for m in llm.engine.runner.model.modules() if type(m).__name__ == "SparseMoE")
    assert moe.w13.dtype == (torch.float8_e4m3fn if scheme == "fp8" else torch.uint8)
    ref_dir = _reference_dir(src, scheme, tmp_path / "ref")
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(ref_dir), dtype=torch.float32)
    got = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    want = []
    with torch.no_grad():
        for p in PROMPTS:
            out = ref.eval().generate(
                torch.tensor([p]), max_new_tokens=10, do_sample=False, eos_token_id=None,
                attention_mask=torch.ones(1, len(p), dtype=torch.long), pad_token_id=0,
            )  # fmt: skip
            want.append(out[0, len(p) :].tolist())
    if scheme == "fp8":
        # Activations are FP8 too (the reference keeps them fp32), and this random model's
        # 49K logits lie close together: the continuations part after 1 and 3 tokens.
        assert [g[0] for g in got] == [w[0] for w in want]
    else:  # weight-only: the same weights on both sides
        assert got == want


@pytest.mark.parametrize(
    "quantization_config",
    [
        {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"},
        {"quant_method": "modelopt", "quant_algo": "NVFP4"},
    ],
    ids=["fp8-block", "nvfp4-modelopt"],
)
def test_dummy_weights_in_the_checkpoint_layout(quantization_config: dict, tmp_path) -> None:  # noqa: ANN001
    """``load_format="dummy"`` from a config.json alone (as the H200 benchmarks run a
    GLM-4.5-Air shape): the experts are drawn in the format's own layout and the model runs."""
    config = {
        "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "hidden_size": 256,
        "intermediate_size": 512, "moe_intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "partial_rotary_factor": 0.5, "attention_bias": True, "n_routed_experts": 8,
        "n_shared_experts": 1, "num_experts_per_tok": 2, "first_k_dense_replace": 1,
        "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 1.0,
        "vocab_size": 512, "max_position_embeddings": 1024, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": False,
        "quantization_config": quantization_config,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    llm = LLM(model=str(tmp_path), device="cpu", load_format="dummy", max_total_tokens=512)
    moe = next(m for m in llm.engine.runner.model.modules() if type(m).__name__ == "SparseMoE")
    assert moe.w13.dtype in (torch.float8_e4m3fn, torch.uint8)
    out = llm.generate([[5, 6, 7, 8]], SamplingParams(temperature=0, max_tokens=4))
    assert len(out[0].token_ids) == 4


@pytest.mark.parametrize(
    ("env", "cached", "quantization", "default"),
    [
        (FP8_MOE_GEMV_ENV, fp8_moe_gemv_enabled, "fp8", True),
        (HALF_MOE_GEMV_ENV, half_moe_gemv_enabled, None, False),
        (GATED_GEMV_ENV, gated_gemv_enabled, None, True),
    ],
    ids=["fp8", "bf16", "gated"],
)
def test_a_bad_moe_gemv_switch_fails_the_load(
    env: str,
    cached,
    quantization: str | None,
    default: bool,
    tiny_model_dir,
    monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
) -> None:
    """``KVSERVE_FP8_MOE_GEMV`` / ``KVSERVE_BF16_MOE_GEMV`` / ``KVSERVE_GATED_GEMV`` are checked
    when the engine starts, not at the first step; unset, they take their default (the gated
    and FP8 experts' GEMVs on, the bf16 experts' off)."""
    arch = "Qwen3MoeForCausalLM"
    src = tiny_model_dir(arch, **MOE_TINY[arch])
    monkeypatch.setenv(env, "on")
    cached.cache_clear()
    try:
        with pytest.raises(ConfigError, match=f"{env}='on': expected 0 or 1"):
            LLM(model=str(src), device="cpu", quantization=quantization, max_total_tokens=1024)
    finally:
        monkeypatch.delenv(env)
        cached.cache_clear()
    assert cached() == default
