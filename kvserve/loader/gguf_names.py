"""llama.cpp tensor names -> HF parameter names."""

from __future__ import annotations

import re

GGUF_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}

GGUF_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "post_attention_norm": "post_attention_layernorm",  # glm4moe's name for it
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    # mixture of experts: the router, and every expert's matrices stacked in one tensor
    # ([E, I, H] for gate/up, [E, H, I] for down; split per expert by the weight reader)
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
    # GLM-4.5: the shared expert, and the router's score-correction bias (``.bias`` in GGUF)
    "ffn_gate_shexp": "mlp.shared_experts.gate_proj",
    "ffn_up_shexp": "mlp.shared_experts.up_proj",
    "ffn_down_shexp": "mlp.shared_experts.down_proj",
    "exp_probs_b": "mlp.gate.e_score_correction",
}
# GGUF block tensors whose HF name is not <module>.<weight|bias>
_JOINED_SUFFIX = {"mlp.gate.e_score_correction.bias": "mlp.gate.e_score_correction_bias"}

_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_BLOCK_INDEX_RE = re.compile(r"blk\.(\d+)\.")
_GLOBAL_RE = re.compile(r"(\w+)\.(weight|bias)")

# Tensors llama.cpp stores that have no HF parameter: rope_freqs holds precomputed llama3 rope
# frequency factors, which the engine derives from the config instead.
IGNORED_GGUF_TENSORS = frozenset({"rope_freqs.weight"})


def hf_name(gguf_name: str) -> str | None:
    """The HF name of a GGUF tensor, or None when there is no HF equivalent."""
    if match := _BLOCK_RE.fullmatch(gguf_name):
        layer, kind, suffix = match.groups()
        module = GGUF_BLOCK_NAMES.get(kind)
        if module is None:
            return None
        name = f"{module}.{suffix}"
        return f"model.layers.{layer}.{_JOINED_SUFFIX.get(name, name)}"
    if match := _GLOBAL_RE.fullmatch(gguf_name):
        kind, suffix = match.groups()
        module = GGUF_GLOBAL_NAMES.get(kind)
        return None if module is None else f"{module}.{suffix}"
    return None


def block_index(gguf_name: str) -> int | None:
    """The block a GGUF tensor belongs to (``blk.<i>.``), or None for a global tensor."""
    match = _BLOCK_INDEX_RE.match(gguf_name)
    return None if match is None else int(match.group(1))
