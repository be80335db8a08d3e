"""What every attention layer needs for one step, passed explicitly down the model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from kvserve.kernels.store_kv_cache import KVScales
from kvserve.layers.attention import AttentionBackend, AttentionMetadata


class PagedKV(Protocol):
    """The KV memory as the model sees it (``kvserve.engine.runner.kv_pool.KVPool`` is one)."""

    def layer(self, idx: int) -> torch.Tensor:
        """Layer ``idx``'s cache: [2, num_pages, page_size, num_kv_heads, head_dim]."""
        ...

    def scales(self, idx: int) -> KVScales | None:
        """Layer ``idx``'s (k_scale, v_scale) when the cache is FP8, else None."""
        ...


@dataclass
class ForwardContext:
    meta: AttentionMetadata
    kv: PagedKV
    backend: AttentionBackend
