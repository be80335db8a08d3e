"""GGUF metadata -> ``ModelConfig``."""

from __future__ import annotations

from typing import Any

from kvserve.config import ModelConfig, MoEConfig
from kvserve.errors import ConfigError, ModelLoadError
from kvserve.gguf_architectures import GGUF_ARCHITECTURES, hf_architecture
from kvserve.loader.gguf_reader import gguf_field

_EOS_KEYS = (
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.eom_token_id",
)


def gguf_eos_token_ids(reader: Any) -> tuple[int, ...]:
    ids = (gguf_field(reader, key) for key in _EOS_KEYS)
    return tuple(dict.fromkeys(int(i) for i in ids if i is not None))


def read_gguf_config(reader: Any, path: str) -> ModelConfig:
    arch = gguf_field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ModelLoadError(
            f"{path}: GGUF architecture {arch!r} is not supported; "
            f"supported: {', '.join(GGUF_ARCHITECTURES)}"
        )

    def meta(key: str, default: Any = None) -> Any:
        value = gguf_field(reader, f"{arch}.{key}", default)
        if value is None:
            raise ModelLoadError(f"{path}: GGUF metadata lacks {arch}.{key}")
        return value

    hidden = int(meta("embedding_length"))
    heads = int(meta("attention.head_count"))
    head_dim = int(meta("attention.key_length", hidden // heads))
    names = {t.name for t in reader.tensors}
    rotary_dim = int(meta("rope.dimension_count", head_dim))
    architecture = hf_architecture(arch, int(meta("expert_count", 0)))
    try:
        return ModelConfig(
            architecture=architecture,
            vocab_size=_vocab_size(reader, arch),
            hidden_size=hidden,
            intermediate_size=int(meta("feed_forward_length")),
            # llama.cpp counts GLM-4.5's multi-token-prediction layers as blocks; decoding
            # does not use them (their tensors are skipped when the weights are read)
            num_layers=int(meta("block_count")) - int(meta("nextn_predict_layers", 0)),
            num_heads=heads,
            num_kv_heads=int(meta("attention.head_count_kv", heads)),
            head_dim=head_dim,
            rms_norm_eps=float(meta("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_theta=float(meta("rope.freq_base", 10000.0)),
            rope_scaling=_rope_scaling(reader, arch),
            max_position_embeddings=int(meta("context_length", 4096)),
            tie_word_embeddings="output.weight" not in names,
            attention_bias=arch == "qwen2" or "blk.0.attn_q.bias" in names,
            qk_norm=arch in ("qwen3", "qwen3moe") or "blk.0.attn_q_norm.weight" in names,
            rotary_dim=rotary_dim if rotary_dim < head_dim else None,
            moe=_MOE_READERS[architecture](meta) if architecture in _MOE_READERS else None,
            bos_token_id=gguf_field(reader, "tokenizer.ggml.bos_token_id"),
            eos_token_ids=gguf_eos_token_ids(reader),
        )
    except ConfigError as exc:
        raise ModelLoadError(f"{path}: {exc}") from exc


def _mixtral(meta: Any) -> MoEConfig:
    """llama.cpp's Mixtral (``llama`` with experts): every block sparse, each expert
    ``feed_forward_length`` wide, the top-k weights renormalised."""
    return MoEConfig(
        num_experts=int(meta("expert_count")),
        top_k=int(meta("expert_used_count")),
        expert_intermediate_size=int(meta("feed_forward_length")),
        scoring="softmax",
        norm_topk_prob=True,
    )


def _qwen3_moe(meta: Any) -> MoEConfig:
    """llama.cpp's qwen3moe keys: every block is sparse; top-k weights renormalised unless
    ``expert_weights_norm`` says otherwise (Qwen3-MoE releases set norm_topk_prob)."""
    return MoEConfig(
        num_experts=int(meta("expert_count")),
        top_k=int(meta("expert_used_count")),
        expert_intermediate_size=int(meta("expert_feed_forward_length")),
        scoring="softmax",
        norm_topk_prob=bool(meta("expert_weights_norm", True)),
    )


_SIGMOID_GATING = 2  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID (gguf-py's SIGMOID)


def _glm4_moe(meta: Any) -> MoEConfig:
    """llama.cpp's glm4moe keys: sigmoid gating with a correction bias (``exp_probs_b``), the
    first ``leading_dense_block_count`` blocks dense, ``expert_shared_count`` shared experts
    of the routed experts' size, top-k weights scaled by ``expert_weights_scale``. Absent
    keys read as llama.cpp reads them (its converter writes them all): weights not
    renormalised, no dense blocks, no shared expert."""
    gating = int(meta("expert_gating_func", _SIGMOID_GATING))
    if gating != _SIGMOID_GATING:
        raise ConfigError(f"glm4moe expert gating function {gating} is not sigmoid (2)")
    expert_size = int(meta("expert_feed_forward_length"))
    return MoEConfig(
        num_experts=int(meta("expert_count")),
        top_k=int(meta("expert_used_count")),
        expert_intermediate_size=expert_size,
        scoring="grouped_sigmoid",
        norm_topk_prob=bool(meta("expert_weights_norm", False)),
        num_groups=int(meta("expert_group_count", 1)) or 1,  # 0, llama.cpp's default: no groups
        topk_groups=int(meta("expert_group_used_count", 1)) or 1,
        routed_scaling_factor=float(meta("expert_weights_scale", 1.0)),
        shared_expert_intermediate_size=expert_size * int(meta("expert_shared_count", 0)),
        dense_layers=tuple(range(int(meta("leading_dense_block_count", 0)))),
    )


_MOE_READERS = {
    "Qwen3MoeForCausalLM": _qwen3_moe,
    "Glm4MoeForCausalLM": _glm4_moe,
    "MixtralForCausalLM": _mixtral,
}


def _vocab_size(reader: Any, arch: str) -> int:
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is not None:
        return len(tokens.data)
    size = gguf_field(reader, f"{arch}.vocab_size")
    if size is not None:
        return int(size)
    for tensor in reader.tensors:
        if tensor.name == "token_embd.weight":
            return int(tensor.shape[-1])  # ggml order: ne = (hidden, vocab)
    raise ModelLoadError("GGUF file has neither tokenizer tokens nor token_embd.weight")


def _rope_scaling(reader: Any, arch: str) -> dict[str, Any] | None:
    kind = gguf_field(reader, f"{arch}.rope.scaling.type")
    if kind in (None, "none"):
        return None
    scaling: dict[str, Any] = {"rope_type": kind}
    factor = gguf_field(reader, f"{arch}.rope.scaling.factor")
    if factor is not None:
        scaling["factor"] = float(factor)
    original = gguf_field(reader, f"{arch}.rope.scaling.original_context_length")
    if original is not None:
        scaling["original_max_position_embeddings"] = int(original)
    return scaling
