"""GGUF ``general.architecture`` -> the HF architecture kvserve serves it as, for the loader and
for preflight's probe (which imports no torch)."""

from __future__ import annotations

GGUF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
    "glm4moe": "Glm4MoeForCausalLM",
}


def hf_architecture(gguf_arch: str, expert_count: int | None) -> str | None:
    """The HF architecture of a GGUF file (None for an arch kvserve does not read): llama.cpp
    writes Mixtral as ``llama`` with experts (``<arch>.expert_count``)."""
    if gguf_arch == "llama" and expert_count:
        return "MixtralForCausalLM"
    return GGUF_ARCHITECTURES.get(gguf_arch)
