"""Write the step's new keys/values into the paged KV cache.

Reference: ``store_kv_cache_reference`` (the torch attention backend's store). One program per
token; a negative slot means "skip" (padding rows of a CUDA-graph batch), so the grid depends only
on T.
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


def store_kv_cache_reference(
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,  # [T, Hkv, D]
    kv_cache: torch.Tensor,  # [2, num_pages, page_size, Hkv, D]
    slot_mapping: torch.Tensor,  # int64 [T]; every slot >= 0
) -> None:
    """Store new keys/values at their flat cache slots."""
    num_kv_heads, head_dim = kv_cache.shape[-2:]
    kv_cache[0].view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    kv_cache[1].view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)


@jit
def copy_heads(
    src_ptr,
    dst_ptr,
    num_heads,
    src_stride_h,
    dst_stride_h,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """Copy ``num_heads`` heads of one token from ``src`` to ``dst`` (cast to dst's dtype)."""
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, HEAD_DIM)
    mask = (heads < num_heads)[:, None]
    x = tl.load(src_ptr + heads[:, None] * src_stride_h + dims[None, :], mask=mask)
    dst = dst_ptr + heads[:, None] * dst_stride_h + dims[None, :]
    tl.store(dst, x.to(dst_ptr.dtype.element_ty), mask=mask)


@jit
def _store_kv_cache_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    page_size,
    num_kv_heads,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cache_page,
    stride_cache_tok,
    stride_cache_head,
    BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    pdl_release(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
    if slot < 0:
        return
    dst = (slot // page_size) * stride_cache_page + (slot % page_size) * stride_cache_tok
    k_src, k_dst = k_ptr + t * stride_kt, k_cache_ptr + dst
    v_src, v_dst = v_ptr + t * stride_vt, v_cache_ptr + dst
    copy_heads(k_src, k_dst, num_kv_heads, stride_kh, stride_cache_head, BLOCK_H, HEAD_DIM)
    copy_heads(v_src, v_dst, num_kv_heads, stride_vh, stride_cache_head, BLOCK_H, HEAD_DIM)


def store_kv_cache(
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,  # [T, Hkv, D]
    kv_cache: torch.Tensor,  # [2, num_pages, page_size, Hkv, D]
    slot_mapping: torch.Tensor,  # int64 [T]; < 0 = skip the row
    *,
    pdl: bool = False,
) -> None:
    require_triton()
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    assert kv_cache.shape[-2:] == (num_kv_heads, head_dim), "k/v heads do not match the cache"
    assert head_dim == next_pow2(head_dim), "head_dim must be a power of two"
    assert k.stride(-1) == 1 and v.stride(-1) == 1 and kv_cache.stride(-1) == 1
    k_cache, v_cache = kv_cache[0], kv_cache[1]  # [num_pages, page_size, Hkv, D]
    _store_kv_cache_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        kv_cache.shape[2],
        num_kv_heads,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        BLOCK_H=next_pow2(num_kv_heads),
        HEAD_DIM=head_dim,
        num_warps=4 if num_kv_heads * head_dim >= 1024 else 2,
        **launch_options(pdl),
    )
