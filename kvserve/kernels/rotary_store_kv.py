"""Rotary on q and k plus the paged-KV store, fused into one kernel reading the qkv GEMM output.

Replaces, on the Triton path, the ``.contiguous()`` copies of the q/k/v split views, the rotary
kernel (``rotary.py``) and the store kernel (``store_kv_cache.py``): q is rotated into a
contiguous ``[T, Hq, D]`` output, k is rotated straight into ``kv_cache[0]`` and v copied into
``kv_cache[1]`` at ``slot_mapping[t]``. A negative slot marks a padding row (CUDA-graph batch):
its q is still written, the cache is left untouched. One program per token, the grid depends only
on T, so the launch is graph-capturable.
"""

from __future__ import annotations

import torch

from kvserve.kernels._triton import (
    jit,
    launch_options,
    next_pow2,
    pdl_release,
    pdl_wait,
    require_triton,
    tl,
)
from kvserve.kernels.rotary import apply_rotary_reference, load_cos_sin, rotate_heads
from kvserve.kernels.store_kv_cache import (
    KVScales,
    copy_heads,
    is_fp8_kv,
    load_inv_scales,
    scale_args,
    store_kv_cache_reference,
)


def rotary_store_kv_reference(
    qkv: torch.Tensor,  # [T, (Hq + 2 * Hkv) * D]
    positions: torch.Tensor,  # int64 [T]
    cos_sin_cache: torch.Tensor,  # float32 [max_pos, D]
    kv_cache: torch.Tensor,  # [2, num_pages, page_size, Hkv, D]; written in place
    slot_mapping: torch.Tensor,  # int64 [T]; < 0 = padding row, not stored
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    kv_scales: KVScales | None = None,
) -> torch.Tensor:  # [T, Hq, D]
    q_size, kv_size = num_q_heads * head_dim, num_kv_heads * head_dim
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q, k = apply_rotary_reference(q, k, positions, cos_sin_cache, head_dim)
    keep = slot_mapping >= 0
    heads = (-1, num_kv_heads, head_dim)
    k, v = k[keep].view(heads), v[keep].view(heads)
    store_kv_cache_reference(k, v, kv_cache, slot_mapping[keep], kv_scales)
    return q.view(-1, num_q_heads, head_dim)


@jit
def _rotary_store_kv_kernel(
    qkv_ptr,
    positions_ptr,
    cos_sin_ptr,
    q_out_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    k_scale_ptr,
    v_scale_ptr,
    num_q_heads,
    num_kv_heads,
    page_size,
    stride_qkv_t,
    stride_cs,
    stride_qo_t,
    stride_qo_h,
    stride_cache_page,
    stride_cache_tok,
    stride_cache_head,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    HALF: tl.constexpr,
    FP8: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    pdl_release(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    cos, sin = load_cos_sin(cos_sin_ptr, positions_ptr, t, stride_cs, HALF)
    q_src = qkv_ptr + t * stride_qkv_t
    q_dst = q_out_ptr + t * stride_qo_t
    rotate_heads(q_src, q_dst, num_q_heads, 2 * HALF, stride_qo_h, cos, sin, BLOCK_HQ, HALF)
    slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
    if slot >= 0:
        k_inv, v_inv = load_inv_scales(k_scale_ptr, v_scale_ptr, FP8)
        dst = (slot // page_size) * stride_cache_page + (slot % page_size) * stride_cache_tok
        k_src = q_src + num_q_heads * (2 * HALF)
        v_src = k_src + num_kv_heads * (2 * HALF)
        rotate_heads(
            k_src, k_cache_ptr + dst, num_kv_heads, 2 * HALF, stride_cache_head, cos, sin,
            BLOCK_HK, HALF, k_inv, FP8,
        )  # fmt: skip
        copy_heads(
            v_src, v_cache_ptr + dst, num_kv_heads, 2 * HALF, stride_cache_head, v_inv,
            BLOCK_HK, 2 * HALF, FP8,
        )  # fmt: skip


def _check_inputs(
    qkv: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    kv_cache: torch.Tensor,
    q_out: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
) -> None:
    assert head_dim % 2 == 0 and head_dim // 2 == next_pow2(head_dim // 2)
    assert qkv.shape[1] == (num_q_heads + 2 * num_kv_heads) * head_dim, "qkv width mismatch"
    assert qkv.stride(1) == 1, "qkv rows must be contiguous (the row stride may be wider)"
    assert cos_sin_cache.dtype == torch.float32 and cos_sin_cache.shape[1] == head_dim
    assert cos_sin_cache.stride(1) == 1
    assert kv_cache.shape[-2:] == (num_kv_heads, head_dim), "k/v heads do not match the cache"
    assert kv_cache.stride(-1) == 1
    assert q_out.shape == (qkv.shape[0], num_q_heads, head_dim) and q_out.stride(-1) == 1


def rotary_store_kv(
    qkv: torch.Tensor,  # [T, (Hq + 2 * Hkv) * D]; read through its strides
    positions: torch.Tensor,  # int64 [T]
    cos_sin_cache: torch.Tensor,  # float32 [max_pos, D]: cos | sin
    kv_cache: torch.Tensor,  # [2, num_pages, page_size, Hkv, D]; written in place
    slot_mapping: torch.Tensor,  # int64 [T]; < 0 = padding row, not stored
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    q_out: torch.Tensor | None = None,  # [T, Hq, D]
    kv_scales: KVScales | None = None,  # needed by an FP8 cache
    *,
    pdl: bool = False,
) -> torch.Tensor:
    """Rotated q as ``q_out`` (allocated when None); rotated k and plain v go to the cache."""
    require_triton()
    num_tokens = qkv.shape[0]
    if q_out is None:
        q_out = qkv.new_empty(num_tokens, num_q_heads, head_dim)
    _check_inputs(qkv, cos_sin_cache, kv_cache, q_out, num_q_heads, num_kv_heads, head_dim)
    if num_tokens == 0:
        return q_out
    k_cache, v_cache = kv_cache[0], kv_cache[1]  # [num_pages, page_size, Hkv, D]
    _rotary_store_kv_kernel[(num_tokens,)](
        qkv,
        positions,
        cos_sin_cache,
        q_out,
        k_cache,
        v_cache,
        slot_mapping,
        *scale_args(kv_cache, kv_scales),
        num_q_heads,
        num_kv_heads,
        kv_cache.shape[2],
        qkv.stride(0),
        cos_sin_cache.stride(0),
        q_out.stride(0),
        q_out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        BLOCK_HQ=next_pow2(num_q_heads),
        BLOCK_HK=next_pow2(num_kv_heads),
        HALF=head_dim // 2,
        FP8=is_fp8_kv(kv_cache),
        num_warps=4,
        **launch_options(pdl),
    )
    return q_out
