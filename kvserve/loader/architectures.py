"""The model architectures kvserve serves, by HF ``architectures`` name (the model registry's
list) and GGUF arch name."""

from __future__ import annotations

from kvserve.errors import ModelLoadError
from kvserve.gguf_architectures import GGUF_ARCHITECTURES
from kvserve.models.registry import SUPPORTED_ARCHITECTURES

__all__ = ["GGUF_ARCHITECTURES", "SUPPORTED_ARCHITECTURES", "check_supported"]


def check_supported(architecture: str, source: str) -> str:
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"{source}: architecture {architecture!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    return architecture
