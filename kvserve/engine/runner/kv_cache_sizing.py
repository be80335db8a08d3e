"""How many KV pages to allocate: a token budget on CPU, a share of GPU memory on CUDA."""

from __future__ import annotations

import torch

from kvserve import kv_layout
from kvserve.config import CacheConfig, ModelConfig

DEFAULT_CPU_TOKENS = 32768


def kv_bytes_per_token(model: ModelConfig, dtype: torch.dtype) -> int:
    return kv_layout.kv_bytes_per_token(
        model.num_layers, model.num_kv_heads, model.head_dim, dtype.itemsize
    )


def num_pages_cpu(cache: CacheConfig, context_length: int) -> int:
    tokens = cache.max_total_tokens or max(DEFAULT_CPU_TOKENS, context_length)
    return tokens // cache.page_size


def num_pages_gpu(
    cache: CacheConfig,
    model: ModelConfig,
    kv_dtype: torch.dtype,
    device: torch.device,
    activation_peak_bytes: int,
) -> int:
    """Pages that fit in ``mem_fraction_static`` of the GPU after what is already allocated
    (weights) and the measured activation peak of the largest step."""
    if cache.max_total_tokens:
        return cache.max_total_tokens // cache.page_size
    free, total = torch.cuda.mem_get_info(device)
    used = total - free
    budget = total * cache.mem_fraction_static - used - activation_peak_bytes
    page_bytes = kv_bytes_per_token(model, kv_dtype) * cache.page_size
    return max(int(budget // page_bytes), 0)
