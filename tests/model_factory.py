"""Real model files for tests: the bundled GGUF, its transformers reference, tiny random models.

Plain functions (no fixtures) so conftest can wire them in at any scope.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import torch

TINY_VOCAB = 49152  # the bundled tokenizer's vocabulary, saved beside every tiny model

ROPE_SCALINGS: dict[str, dict[str, Any]] = {
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 1024,
    },
    "linear": {"rope_type": "linear", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
}

_ARCH_CONFIGS = {
    "LlamaForCausalLM": "LlamaConfig",
    "Qwen2ForCausalLM": "Qwen2Config",
    "Qwen3ForCausalLM": "Qwen3Config",
    "Qwen3MoeForCausalLM": "Qwen3MoeConfig",
    "Glm4MoeForCausalLM": "Glm4MoeConfig",
    "MixtralForCausalLM": "MixtralConfig",
    "MistralForCausalLM": "MistralConfig",
}


# Tiny mixture-of-experts configs (make_tiny_model overrides): Qwen3 and GLM have a sparse and a
# dense layer; GLM adds grouped sigmoid routing, a shared expert, partial rotary and q/k/v
# biases; Mixtral's layers are all sparse, its experts as wide as intermediate_size.
MOE_TINY: dict[str, dict[str, Any]] = {
    "Qwen3MoeForCausalLM": {
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
        "decoder_sparse_step": 2,  # layer 0 dense, layer 1 sparse
    },
    "Glm4MoeForCausalLM": {
        "n_routed_experts": 8,
        "num_experts_per_tok": 3,
        "moe_intermediate_size": 32,
        "n_group": 4,
        "topk_group": 2,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "routed_scaling_factor": 2.5,
        "attention_bias": True,
    },
    "MixtralForCausalLM": {
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "intermediate_size": 32,
        "sliding_window": None,
    },
}


def bundled_gguf_path() -> str:
    from kvserve.loader.bundled import bundled_model_path

    return bundled_model_path()


@functools.lru_cache(maxsize=4)
def load_reference_model(path: str) -> Any:
    """The transformers model for an HF directory or GGUF file: float32, eval, cached."""
    import transformers

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    kwargs: dict[str, Any] = {"dtype": torch.float32}
    if path.endswith(".gguf"):
        path, kwargs["gguf_file"] = os.path.split(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, **kwargs)
    return model.eval()


def hf_greedy(path: str | Path, prompt: list[int], tokens: int) -> list[int]:
    """transformers' greedy continuation of ``prompt`` (token ids), ``tokens`` long, no EOS."""
    ref = load_reference_model(str(path))
    with torch.no_grad():
        out = ref.generate(torch.tensor([prompt]), max_new_tokens=tokens, do_sample=False,
                           attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                           eos_token_id=None, pad_token_id=0)  # fmt: skip
    return out[0, len(prompt) :].tolist()


def make_tiny_model(
    arch: str,
    out_dir: Path,
    *,
    num_layers: int = 2,
    tie_word_embeddings: bool = False,
    rope_scaling: str | dict[str, Any] | None = None,
    max_shard_size: str | None = None,
    chat_template: str | None = None,
    generation_config: dict[str, Any] | None = None,
    seed: int = 0,
    **overrides: Any,
) -> Path:
    """Save a tiny random ``arch`` model with the bundled tokenizer into ``out_dir``.

    ``rope_scaling`` is a key of ROPE_SCALINGS or a dict; ``max_shard_size`` (e.g. "200KB")
    writes a sharded checkpoint with an index; ``overrides`` go to the transformers config.
    """
    import transformers

    config_cls = getattr(transformers, _ARCH_CONFIGS[arch])
    fields: dict[str, Any] = {
        "vocab_size": TINY_VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": tie_word_embeddings,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
    }
    if rope_scaling is not None:
        scaling = ROPE_SCALINGS[rope_scaling] if isinstance(rope_scaling, str) else rope_scaling
        fields["rope_parameters"] = {"rope_theta": 10000.0, **scaling}
    fields.update(overrides)
    config = config_cls(**fields)
    config.architectures = [arch]
    torch.manual_seed(seed)
    model = getattr(transformers, arch)(config).eval()
    _randomize_router_biases(model)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_kwargs: dict[str, Any] = {"safe_serialization": True}
    if max_shard_size is not None:
        save_kwargs["max_shard_size"] = max_shard_size
    model.save_pretrained(out_dir, **save_kwargs)
    _save_tokenizer(out_dir, chat_template)
    gen = {"bos_token_id": 1, "eos_token_id": [2], "temperature": 0.7, "top_p": 0.9}
    (out_dir / "generation_config.json").write_text(json.dumps(generation_config or gen))
    return out_dir


def _randomize_router_biases(model: Any) -> None:
    """Routers' score-correction biases start at zero; random ones make tests exercise them."""
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(torch.randn_like(buffer) * 0.1)


def _save_tokenizer(out_dir: Path, chat_template: str | None) -> None:
    from kvserve.loader.tokenizer import load_tokenizer

    tok = load_tokenizer(bundled_gguf_path())  # shared per process: never modify it
    tok.hf.save_pretrained(out_dir)
    (out_dir / "chat_template.jinja").write_text(chat_template or tok.chat_template)


def llama_cpp_permute(weight: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's converter reorders Q/K rows per head for its adjacent-pair rope."""
    rows = weight.shape[0]
    return (
        weight.reshape(n_head, 2, rows // n_head // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def make_tiny_gguf(
    arch: str, out_dir: Path, tensor_type: str = "Q8_0", nextn_layers: int = 0, **overrides: Any
) -> tuple[Path, Path]:
    """Convert a tiny HF model (see make_tiny_model) to GGUF as llama.cpp would.

    2-D weights are stored as ``tensor_type`` (F32, F16, BF16, Q8_0, Q4_0, Q4_1), 1-D as F32;
    ``nextn_layers`` random multi-token-prediction blocks are appended (GLM-4.5's; transformers
    drops them from its models); returns (gguf file, HF directory it came from).
    """
    import gguf
    from gguf.quants import quantize
    from safetensors.torch import load_file

    from kvserve.loader.architectures import GGUF_ARCHITECTURES

    hf_dir = make_tiny_model(arch, out_dir / "hf", **overrides)
    config = json.loads((hf_dir / "config.json").read_text())
    # llama.cpp writes Mixtral as llama with experts
    gguf_arch = {v: k for k, v in GGUF_ARCHITECTURES.items()}.get(arch, "llama")
    path = out_dir / f"tiny-{gguf_arch}-{tensor_type}.gguf"
    writer = gguf.GGUFWriter(str(path), gguf_arch)
    _write_gguf_metadata(writer, config, nextn_layers)
    kind = gguf.GGMLQuantizationType[tensor_type]
    tensors = _stack_experts(load_file(str(hf_dir / "model.safetensors")))
    tensors |= _nextn_block(config, nextn_layers)
    # llama.cpp's own HF -> GGUF tensor names (gguf-py), per architecture
    names = gguf.get_tensor_name_map(
        {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[gguf_arch],
        config["num_hidden_layers"] + nextn_layers,
    )  # fmt: skip
    for hf_name, weight in sorted(tensors.items()):
        if gguf_arch == "llama" and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config["num_attention_heads" if "q_proj" in hf_name else "num_key_value_heads"]
            weight = llama_cpp_permute(weight, heads)
        array = weight.float().numpy()
        # the converter's rename of GLM-4.5's router bias, to the ``exp_probs_b.bias`` it maps
        hf_name = hf_name.replace("e_score_correction_bias", "e_score_correction.bias")
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, f"gguf-py has no {gguf_arch} name for {hf_name}"
        if array.ndim == 1:
            writer.add_tensor(name, array)
        else:
            writer.add_tensor(name, quantize(array, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, hf_dir


def _stack_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """llama.cpp's layout: ``mlp.experts.<e>.<proj>.weight`` stacked into one
    ``mlp.experts.<proj>.weight`` [E, ...] per layer (renamed ``ffn_<proj>_exps`` later)."""
    out: dict[str, torch.Tensor] = {}
    stacks: dict[str, dict[int, torch.Tensor]] = {}
    for name, weight in tensors.items():
        prefix, sep, rest = name.partition(".experts.")
        if not sep:
            out[name] = weight
            continue
        expert, _, proj = rest.partition(".")
        stacks.setdefault(f"{prefix}.experts.{proj}", {})[int(expert)] = weight
    for name, by_expert in stacks.items():
        out[name] = torch.stack([by_expert[e] for e in sorted(by_expert)])
    return out


_GGUF_ARCHS = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def _nextn_block(config: dict[str, Any], nextn_layers: int) -> dict[str, torch.Tensor]:
    """HF-named tensors of GLM-4.5's multi-token-prediction blocks past the decoder's layers:
    their own projections and norms, and an attention like any layer's."""
    h, first = config["hidden_size"], config["num_hidden_layers"]
    out: dict[str, torch.Tensor] = {}
    for layer in range(first, first + nextn_layers):
        p = f"model.layers.{layer}."
        out[p + "eh_proj.weight"] = torch.randn(h, 2 * h)
        for norm in ("enorm", "hnorm", "input_layernorm", "shared_head.norm"):
            out[p + norm + ".weight"] = torch.ones(h)
        out[p + "self_attn.q_proj.weight"] = torch.randn(h, h)
        experts, inter = config.get("n_routed_experts", 0), config.get("moe_intermediate_size")
        if experts:  # its own routed experts, stacked as the decoder's are
            out[p + "mlp.experts.gate_proj.weight"] = torch.randn(experts, inter, h)
            out[p + "mlp.experts.down_proj.weight"] = torch.randn(experts, h, inter)
    return out


def _write_gguf_metadata(writer: Any, config: dict[str, Any], nextn_layers: int = 0) -> None:
    import gguf

    writer.add_block_count(config["num_hidden_layers"] + nextn_layers)
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    names = ("num_experts", "num_local_experts", "n_routed_experts")
    experts = next((config[n] for n in names if config.get(n)), None)
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(config["num_experts_per_tok"])
        if "moe_intermediate_size" in config:  # not Mixtral's: its experts' is the FFN's
            writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
            writer.add_expert_weights_norm(config["norm_topk_prob"])
    if "n_routed_experts" in config:  # GLM-4.5
        _write_glm4_moe_metadata(writer, config, nextn_layers)
    scaling = config["rope_parameters"]
    if scaling.get("rope_type") in ("linear", "yarn"):
        writer.add_rope_scaling_type(gguf.RopeScalingType(scaling["rope_type"]))
        writer.add_rope_scaling_factor(scaling["factor"])
        if "original_max_position_embeddings" in scaling:
            writer.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])


def _write_glm4_moe_metadata(writer: Any, config: dict[str, Any], nextn_layers: int) -> None:
    import gguf

    writer.add_expert_shared_count(config["n_shared_experts"])
    writer.add_leading_dense_block_count(config["first_k_dense_replace"])
    writer.add_expert_weights_scale(config["routed_scaling_factor"])
    writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    writer.add_expert_group_count(config["n_group"])
    writer.add_expert_group_used_count(config["topk_group"])
    factor = config.get("partial_rotary_factor") or config["rope_parameters"].get(
        "partial_rotary_factor", 1.0
    )
    writer.add_rope_dimension_count(int(config["head_dim"] * factor))
    writer.add_nextn_predict_layers(nextn_layers)
