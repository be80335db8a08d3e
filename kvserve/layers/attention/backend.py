"""The attention backend seam: one interface, picked once by a factory from config."""

from __future__ import annotations

from typing import Protocol

import torch

from kvserve.errors import ConfigError
from kvserve.kernels.store_kv_cache import KVScales
from kvserve.layers.attention.metadata import AttentionMetadata


class AttentionBackend(Protocol):
    name: str
    fuses_rotary_store: bool  # takes k/v stored by the model's fused rotary kernel (``attend``)

    def forward(
        self,
        q: torch.Tensor,  # [T, num_heads, head_dim]
        k: torch.Tensor,  # [T, num_kv_heads, head_dim]
        v: torch.Tensor,  # [T, num_kv_heads, head_dim]
        kv_cache: torch.Tensor,  # [2, num_pages, page_size, num_kv_heads, head_dim]
        meta: AttentionMetadata,
        scale: float,
        kv_scales: KVScales | None = None,  # the layer's k/v scales; needed by an FP8 cache
    ) -> torch.Tensor:  # [T, num_heads, head_dim]
        """Write the new k/v at ``meta.slot_mapping``, then ``attend``."""
        ...

    def attend(
        self,
        q: torch.Tensor,  # [T, num_heads, head_dim]
        kv_cache: torch.Tensor,  # [2, num_pages, page_size, num_kv_heads, head_dim]
        meta: AttentionMetadata,
        scale: float,
        kv_scales: KVScales | None = None,
    ) -> torch.Tensor:  # [T, num_heads, head_dim]
        """Attend causally over the cache, which already holds this step's k/v."""
        ...


def create_attention_backend(
    name: str, device: torch.device, pdl: bool = False
) -> AttentionBackend:
    """``auto`` is triton on CUDA when Triton is importable, torch otherwise. ``pdl``: launch
    the Triton kernels with programmatic dependent launch (sm_90+)."""
    if name == "auto":
        name = "triton" if device.type == "cuda" and _triton_available() else "torch"
    if name == "torch":
        from kvserve.layers.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend()
    if name == "triton":
        if device.type != "cuda":
            raise ConfigError("the triton attention backend needs a CUDA device")
        from kvserve.layers.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend(pdl)
    raise ConfigError(f"unknown attention backend {name!r} (choose auto, torch or triton)")


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
