"""The mixture-of-experts and partial-rotary fields of an HF ``config.json``, normalised.

Each family spells them its own way: Qwen3-MoE (``num_experts``, ``decoder_sparse_step``,
``mlp_only_layers``), Mixtral (``num_local_experts``, experts of ``intermediate_size``),
GLM-4.5 (``n_routed_experts``, ``first_k_dense_replace``, grouped sigmoid routing, shared
experts, ``partial_rotary_factor``).
"""

from __future__ import annotations

from typing import Any

from kvserve.config import MoEConfig


def moe_config_of(data: dict[str, Any], architecture: str) -> MoEConfig | None:
    if architecture == "Qwen3MoeForCausalLM":
        return _qwen3_moe(data)
    if architecture == "Glm4MoeForCausalLM":
        return _glm4_moe(data)
    if architecture == "MixtralForCausalLM":
        return _mixtral(data)
    return None


def _qwen3_moe(data: dict[str, Any]) -> MoEConfig:
    experts = int(data.get("num_experts") or data["num_local_experts"])
    step = int(data.get("decoder_sparse_step") or 1)
    dense_only = {int(i) for i in data.get("mlp_only_layers") or ()}
    layers = int(data["num_hidden_layers"])
    dense = tuple(i for i in range(layers) if i in dense_only or (i + 1) % step)
    return MoEConfig(
        num_experts=experts,
        top_k=int(data["num_experts_per_tok"]),
        expert_intermediate_size=int(data["moe_intermediate_size"]),
        scoring="softmax",
        norm_topk_prob=bool(data.get("norm_topk_prob", False)),
        dense_layers=dense,
    )


def _mixtral(data: dict[str, Any]) -> MoEConfig:
    """Every layer sparse; each expert as wide as ``intermediate_size``; the top-k weights are
    always renormalised (a softmax over the chosen logits)."""
    return MoEConfig(
        num_experts=int(data["num_local_experts"]),
        top_k=int(data["num_experts_per_tok"]),
        expert_intermediate_size=int(data["intermediate_size"]),
        scoring="softmax",
        norm_topk_prob=True,
    )


def _glm4_moe(data: dict[str, Any]) -> MoEConfig:
    expert_size = int(data["moe_intermediate_size"])
    return MoEConfig(
        num_experts=int(data.get("n_routed_experts") or data["num_local_experts"]),
        top_k=int(data["num_experts_per_tok"]),
        expert_intermediate_size=expert_size,
        scoring="grouped_sigmoid",
        norm_topk_prob=bool(data.get("norm_topk_prob", True)),
        num_groups=int(data.get("n_group") or 1),
        topk_groups=int(data.get("topk_group") or 1),
        routed_scaling_factor=float(data.get("routed_scaling_factor") or 1.0),
        shared_expert_intermediate_size=expert_size * int(data.get("n_shared_experts") or 0),
        dense_layers=tuple(range(int(data.get("first_k_dense_replace") or 0))),
    )


def rotary_dim_of(data: dict[str, Any], head_dim: int) -> int | None:
    """Head dims that rotary turns when the config rotates only part of each head."""
    factor = data.get("partial_rotary_factor")
    if factor is None:
        factor = (data.get("rope_parameters") or {}).get("partial_rotary_factor")
    if factor is None or float(factor) >= 1.0:
        return None
    return int(head_dim * float(factor))


def qk_norm_of(data: dict[str, Any], architecture: str) -> bool:
    """Qwen3 families always normalise q/k per head; GLM-4.5 says so in ``use_qk_norm``."""
    if architecture in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"):
        return True
    return bool(data.get("use_qk_norm", False))
