from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize, quantize
from model_factory import (
    MOE_TINY,
    bundled_gguf_path,
    llama_cpp_permute,
    make_tiny_gguf,
)
from safetensors.torch import load_file

from kvserve import SamplingParams
from kvserve.engine.config_builder import build_engine_config
from kvserve.engine.engine_core import EngineCore
from kvserve.loader import open_model_source
from kvserve.loader.gguf_weights import unpermute_rope_rows
from kvserve.loader.mixtral_names import decoder_name


def test_bundled_config() -> None:
    src = open_model_source(None)
    cfg = src.config
    assert src.format == "gguf" and src.path == bundled_gguf_path()
    assert cfg.architecture == "LlamaForCausalLM"
    assert (cfg.num_layers, cfg.hidden_size, cfg.intermediate_size) == (30, 576, 1536)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (9, 3, 64)
    assert cfg.vocab_size == 49152
    assert cfg.tie_word_embeddings is True
    assert cfg.rope_theta == 100000.0 and cfg.rope_scaling is None
    assert cfg.rms_norm_eps == pytest.approx(1e-5)
    assert cfg.max_position_embeddings == 8192
    assert (cfg.attention_bias, cfg.qk_norm) == (False, False)
    assert cfg.bos_token_id == 1 and cfg.eos_token_ids == (2,)
    assert src.generation_defaults.eos_token_ids == (2,)
    assert src.generation_defaults.temperature is None


def test_bundled_weights_equal_transformers(bundled_reference) -> None:  # noqa: ANN001
    reference = bundled_reference.state_dict()
    ours = dict(open_model_source(None).weights())
    assert set(ours) == set(reference) - {"lm_head.weight"}  # tied: lm_head is the embedding
    for name, tensor in ours.items():
        assert tensor.dtype == torch.float32
        assert tensor.shape == reference[name].shape, name
        torch.testing.assert_close(tensor, reference[name], rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize("n_head", [1, 3, 9])
def test_unpermute_inverts_llama_cpp_permute(n_head: int) -> None:
    weight = torch.randn(n_head * 16, 24)
    permuted = llama_cpp_permute(weight, n_head)
    assert not torch.equal(permuted, weight)
    restored = unpermute_rope_rows(permuted.numpy(), n_head)
    assert np.array_equal(restored, weight.numpy())


@pytest.mark.parametrize(
    ("arch", "tensor_type"),
    [
        ("LlamaForCausalLM", "Q8_0"),
        ("LlamaForCausalLM", "Q4_0"),
        ("LlamaForCausalLM", "Q4_1"),
        ("Qwen2ForCausalLM", "F16"),
        ("Qwen3ForCausalLM", "BF16"),
        ("Qwen3ForCausalLM", "F32"),
    ],
)
def test_tiny_gguf_weights_equal_quantized_hf_weights(
    arch: str, tensor_type: str, tmp_path: Path
) -> None:
    path, hf_dir = make_tiny_gguf(arch, tmp_path, tensor_type, rope_scaling="yarn")
    src = open_model_source(str(path))
    cfg = src.config
    assert cfg.architecture == arch
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size) == (4, 2, 16, 64)
    assert cfg.attention_bias == (arch == "Qwen2ForCausalLM")
    assert cfg.qk_norm == (arch == "Qwen3ForCausalLM")
    assert cfg.rope_scaling == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 1024,
    }
    kind = gguf.GGMLQuantizationType[tensor_type]
    reference = load_file(str(hf_dir / "model.safetensors"))
    ours = dict(src.weights())
    assert set(ours) == set(reference)
    for name, weight in reference.items():
        array = weight.numpy()
        expected = array if array.ndim == 1 else dequantize(quantize(array, kind), kind)
        assert np.array_equal(ours[name].numpy(), expected), name


def test_qwen3_moe_gguf_stacked_experts_load_per_expert(tmp_path: Path) -> None:
    """llama.cpp stores each layer's experts stacked (ffn_gate_exps [E, I, H], ...); they load
    under the HF per-expert names with the values of the HF checkpoint."""
    overrides = {**MOE_TINY["Qwen3MoeForCausalLM"], "decoder_sparse_step": 1}
    path, hf_dir = make_tiny_gguf("Qwen3MoeForCausalLM", tmp_path, "F32", **overrides)
    src = open_model_source(str(path))
    moe = src.config.moe
    assert src.config.architecture == "Qwen3MoeForCausalLM" and src.config.qk_norm
    assert moe is not None and (moe.num_experts, moe.top_k, moe.norm_topk_prob) == (8, 2, True)
    assert moe.expert_intermediate_size == 32 and moe.dense_layers == ()
    reference = load_file(str(hf_dir / "model.safetensors"))
    ours = dict(src.weights())
    assert set(ours) == set(reference)
    for name, weight in reference.items():
        assert torch.equal(ours[name], weight), name


def test_glm4_moe_gguf_loads_as_its_hf_checkpoint(tmp_path: Path) -> None:
    """llama.cpp's glm4moe layout, named by gguf-py's own tensor map: the same config as the HF
    checkpoint's (grouped sigmoid routing, shared expert, dense first layer, partial rotary,
    q/k/v biases), the same weights, the multi-token-prediction block skipped, and the same
    greedy tokens from the engine."""
    overrides = {**MOE_TINY["Glm4MoeForCausalLM"], "num_layers": 3}
    glm = "Glm4MoeForCausalLM"
    path, hf_dir = make_tiny_gguf(glm, tmp_path, "F32", nextn_layers=1, **overrides)
    src, hf = open_model_source(str(path)), open_model_source(str(hf_dir))
    assert src.config.num_layers == 3 and src.config.rotary_dim == 8
    eps = pytest.approx(hf.config.rms_norm_eps)  # GGUF stores it as float32
    assert replace(src.config, rms_norm_eps=eps) == hf.config
    reference = load_file(str(hf_dir / "model.safetensors"))
    ours = dict(src.weights())
    assert set(ours) == set(reference)  # blk.3 (the nextn block) is not read
    for name, weight in reference.items():
        assert torch.equal(ours[name], weight), name
    prompt = [5, 17, 300, 42, 9, 77, 1000, 3]
    assert _greedy(str(path), prompt) == _greedy(str(hf_dir), prompt)


def test_mixtral_gguf_loads_as_its_hf_checkpoint(tmp_path: Path) -> None:
    """llama.cpp writes Mixtral as ``llama`` with stacked experts (Q/K permuted as Llama's): it
    reads as the HF checkpoint's config and weights (``block_sparse_moe.experts.<e>.w1`` there)
    and gives its greedy tokens."""
    mixtral = "MixtralForCausalLM"
    path, hf_dir = make_tiny_gguf(mixtral, tmp_path, "F32", **MOE_TINY[mixtral])
    src, hf = open_model_source(str(path)), open_model_source(str(hf_dir))
    assert src.config.architecture == mixtral
    eps = pytest.approx(hf.config.rms_norm_eps)  # GGUF stores it as float32
    assert replace(src.config, rms_norm_eps=eps) == hf.config
    reference = load_file(str(hf_dir / "model.safetensors"))
    ours = dict(src.weights())
    assert set(ours) == {decoder_name(n) for n in reference}
    for name, weight in reference.items():
        assert torch.equal(ours[decoder_name(name)], weight), name
    prompt = [5, 17, 300, 42, 9, 77, 1000, 3]
    assert _greedy(str(path), prompt) == _greedy(str(hf_dir), prompt)


def _greedy(model: str, prompt: list[int], n: int = 12) -> list[int]:
    config = build_engine_config(model, device="cpu", dtype="float32", max_running_requests=2)
    core = EngineCore(config)
    core.add_request("r", prompt, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
    tokens: list[int] = []
    while core.has_unfinished():
        tokens += [t for out in core.step() for t in out.new_token_ids]
    return tokens


@pytest.mark.parametrize("tensor_type", ["Q4_K", "Q5_K", "Q6_K"])
def test_k_quant_blocks_dequantize_to_hf_shape(tensor_type: str, tmp_path: Path) -> None:
    """gguf-py cannot quantize K-quants: write random raw blocks, check name, shape, values."""
    kind = gguf.GGMLQuantizationType[tensor_type]
    block, type_size = gguf.GGML_QUANT_SIZES[kind]
    rows, cols = 8, 2 * block
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, size=(rows, cols // block * type_size), dtype=np.uint8)
    path = tmp_path / "k.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("blk.0.ffn_up.weight", raw, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    from kvserve.loader.gguf_reader import open_gguf
    from kvserve.loader.gguf_weights import iter_gguf_weights

    reader = open_gguf(str(path))
    ((name, tensor),) = list(iter_gguf_weights(reader, open_model_source(None).config, str(path)))
    assert name == "model.layers.0.mlp.up_proj.weight"
    assert tensor.shape == (rows, cols)
    np.testing.assert_array_equal(tensor.numpy(), dequantize(raw, kind).reshape(rows, cols))
