"""Random-weight Llama checkpoints for benchmarks and GPU tests (no download): the tensor names
and shapes of a Llama config, grouped per shard, and N(0, 0.02) bf16 values (norms at 1)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


def layer_shapes(cfg: dict[str, Any], n: int) -> dict[str, tuple[int, ...]]:
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    d = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    p = f"model.layers.{n}."
    return {p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i), p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,)}  # fmt: skip


def llama_shards(cfg: dict[str, Any]) -> Iterator[dict[str, tuple[int, ...]]]:
    """Embeddings, LM head and final norm, then one dict per layer."""
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    yield {"model.embed_tokens.weight": (v, h), "lm_head.weight": (v, h), "model.norm.weight": (h,)}
    for n in range(cfg["num_hidden_layers"]):
        yield layer_shapes(cfg, n)


def random_tensor(shape: tuple[int, ...], device: str, gen: torch.Generator) -> torch.Tensor:
    """A bf16 host tensor: ones for a norm, else N(0, 0.02) drawn on ``device``."""
    if len(shape) == 1:
        return torch.ones(shape, dtype=torch.bfloat16)
    t = torch.empty(shape, device=device).normal_(0, 0.02, generator=gen)
    return t.to(torch.bfloat16).cpu()
