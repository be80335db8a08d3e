"""Which attention window an HF ``config.json`` gives its layers, for the loader (the context
the engine serves) and preflight (the context it checks), which imports no torch."""

from __future__ import annotations

from typing import Any


def sliding_window_of(data: dict[str, Any], architecture: str) -> int | None:
    """The attention window of the config's windowed layers, None when no layer has one:
    Mistral's ``sliding_window`` (4096 when the key is absent, as transformers reads it); Qwen2 /
    Qwen3's only with ``use_sliding_window``, in layers from ``max_window_layers`` on, or where
    ``layer_types`` says ``sliding_attention``."""
    default = 4096 if architecture == "MistralForCausalLM" else None
    window = data.get("sliding_window", default)
    if not window or ("use_sliding_window" in data and not data["use_sliding_window"]):
        return None
    types = data.get("layer_types")
    if types is not None:
        return int(window) if "sliding_attention" in types else None
    first, layers = data.get("max_window_layers"), data.get("num_hidden_layers")
    if first is not None and layers is not None and int(first) >= int(layers):
        return None
    return int(window)
