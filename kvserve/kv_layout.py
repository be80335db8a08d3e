"""Facts about the paged KV cache that every layer shares, from the scheduler's bookkeeping (no
tensors) to the attention kernels and preflight's capacity arithmetic: page arithmetic, bytes per
token, and the KV cache dtypes the KV pool (``kvserve.engine.runner.kv_pool``) can hold.

Nothing here imports torch, so ``engine/core`` and preflight can use it.
"""

from __future__ import annotations

from typing import TypeVar

from kvserve.errors import ConfigError

# KV cache dtypes the KV pool holds, by ``--kv-cache-dtype`` name. "auto" is the model dtype;
# a float name must equal the model dtype (the pool keeps KV in the dtype attention computes
# in). FP8 (e4m3, one byte per value, per-layer k/v scales) works with any model dtype: the
# kernels widen it to the model dtype as they read it. "fp8" is vLLM's alias of fp8_e4m3.
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "float32", "fp8_e4m3", "fp8")
FP8_KV_CACHE_DTYPES = ("fp8_e4m3", "fp8")

# Bytes per element of a KV dtype name.
KV_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8_e4m3": 1, "fp8": 1}

N = TypeVar("N")  # an int, or a numpy integer array (elementwise)


def pages_for(tokens: N, page_size: int) -> N:
    """Pages that hold ``tokens`` tokens: ceil(tokens / page_size)."""
    return -(-tokens // page_size)  # type: ignore[operator]


def check_kv_cache_dtype(name: str, model_dtype: str | None) -> None:
    """Refuse a ``--kv-cache-dtype`` the pool cannot hold with a model in ``model_dtype`` (a
    dtype name; None while it is not known yet, which checks the name alone)."""
    if name not in KV_CACHE_DTYPES:
        raise ConfigError(
            f"kv_cache_dtype {name!r} is not supported (supported: {', '.join(KV_CACHE_DTYPES)})"
        )
    if name in FP8_KV_CACHE_DTYPES:
        return
    if name != "auto" and model_dtype is not None and name != model_dtype:
        raise ConfigError(
            f"--kv-cache-dtype {name} does not match the model dtype ({model_dtype}): the KV "
            "cache is kept in the model dtype or in FP8; use auto or fp8_e4m3"
        )


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """K and V of one token over all layers."""
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes
