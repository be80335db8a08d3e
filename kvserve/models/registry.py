"""HF `architectures` name -> model class, imported lazily. The one list of supported
architectures: the loader and preflight read ``SUPPORTED_ARCHITECTURES``; importing this module
imports no torch."""

from __future__ import annotations

import importlib

from kvserve.errors import ModelLoadError

_MODELS: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("kvserve.models.llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("kvserve.models.llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("kvserve.models.qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("kvserve.models.qwen3", "Qwen3ForCausalLM"),
    "Qwen3MoeForCausalLM": ("kvserve.models.qwen3_moe", "Qwen3MoeForCausalLM"),
    "Glm4MoeForCausalLM": ("kvserve.models.glm4_moe", "Glm4MoeForCausalLM"),
    "MixtralForCausalLM": ("kvserve.models.mixtral", "MixtralForCausalLM"),
}

SUPPORTED_ARCHITECTURES = tuple(_MODELS)


def model_class(architecture: str) -> type:
    if architecture not in _MODELS:
        raise ModelLoadError(
            f"architecture {architecture!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    module, name = _MODELS[architecture]
    return getattr(importlib.import_module(module), name)
