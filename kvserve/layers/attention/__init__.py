"""Attention over a paged KV cache, behind one backend seam (see ``backend.py``)."""

from __future__ import annotations

from kvserve.layers.attention.backend import (
    AttentionBackend,
    check_kv_cache_dtype_on_device,
    create_attention_backend,
    create_prefill_library,
)
from kvserve.layers.attention.metadata import AttentionMetadata

__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "check_kv_cache_dtype_on_device",
    "create_attention_backend",
    "create_prefill_library",
]
