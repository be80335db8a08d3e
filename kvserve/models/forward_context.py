"""What every attention layer needs for one step, passed explicitly down the model."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvserve.layers.attention import AttentionBackend, AttentionMetadata


@dataclass
class ForwardContext:
    meta: AttentionMetadata
    kv_caches: list[torch.Tensor]  # one per layer: [2, num_pages, page_size, Hkv, D]
    backend: AttentionBackend
