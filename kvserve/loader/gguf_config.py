"""GGUF metadata -> ``ModelConfig``."""

from __future__ import annotations

from typing import Any

from kvserve.config import ModelConfig, MoEConfig
from kvserve.errors import ConfigError, ModelLoadError
from kvserve.loader.architectures import GGUF_ARCHITECTURES
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
    try:
        return ModelConfig(
            architecture=GGUF_ARCHITECTURES[arch],
            vocab_size=_vocab_size(reader, arch),
            hidden_size=hidden,
            intermediate_size=int(meta("feed_forward_length")),
            num_layers=int(meta("block_count")),
            num_heads=heads,
            num_kv_heads=int(meta("attention.head_count_kv", heads)),
            head_dim=int(meta("attention.key_length", hidden // heads)),
            rms_norm_eps=float(meta("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_theta=float(meta("rope.freq_base", 10000.0)),
            rope_scaling=_rope_scaling(reader, arch),
            max_position_embeddings=int(meta("context_length", 4096)),
            tie_word_embeddings=not any(t.name == "output.weight" for t in reader.tensors),
            attention_bias=arch == "qwen2",
            qk_norm=arch in ("qwen3", "qwen3moe"),
            moe=_moe(arch, meta) if arch == "qwen3moe" else None,
            bos_token_id=gguf_field(reader, "tokenizer.ggml.bos_token_id"),
            eos_token_ids=gguf_eos_token_ids(reader),
        )
    except ConfigError as exc:
        raise ModelLoadError(f"{path}: {exc}") from exc


def _moe(arch: str, meta: Any) -> MoEConfig:
    """llama.cpp's qwen3moe keys: every block is sparse; top-k weights renormalised unless
    ``expert_weights_norm`` says otherwise (Qwen3-MoE releases set norm_topk_prob)."""
    return MoEConfig(
        num_experts=int(meta("expert_count")),
        top_k=int(meta("expert_used_count")),
        expert_intermediate_size=int(meta("expert_feed_forward_length")),
        scoring="softmax",
        norm_topk_prob=bool(meta("expert_weights_norm", True)),
    )


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
