"""The model architectures kvserve serves, by HF ``architectures`` name (the model registry's
list) and GGUF arch name."""

from __future__ import annotations

from kvserve.errors import ModelLoadError
from kvserve.models.registry import SUPPORTED_ARCHITECTURES

__all__ = ["GGUF_ARCHITECTURES", "SUPPORTED_ARCHITECTURES", "check_supported"]

# GGUF `general.architecture` -> HF architecture name.
GGUF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
    "glm4moe": "Glm4MoeForCausalLM",
}


def check_supported(architecture: str, source: str) -> str:
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"{source}: architecture {architecture!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return architecture
