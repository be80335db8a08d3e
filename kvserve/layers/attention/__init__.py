"""Attention over a paged KV cache, behind one backend seam (see ``backend.py``)."""

from __future__ import annotations

from kvserve.layers.attention.backend import (
    AttentionBackend,
    create_attention_backend,
    create_prefill_library,
)
from kvserve.layers.attention.metadata import AttentionMetadata

__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "create_attention_backend",
    "create_prefill_library",
]
