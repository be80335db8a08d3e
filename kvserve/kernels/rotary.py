"""Rotary position embedding, NeoX / Hugging Face rotate-half style, in place on q and k.

For each head, with ``x1 = x[:D/2]``, ``x2 = x[D/2:]`` and the cos/sin of the token's position:
``out1 = x1 * cos - x2 * sin``, ``out2 = x2 * cos + x1 * sin`` (computed in fp32).
``cos_sin_cache`` is ``[max_pos, D]`` float32: cos in the first D/2 columns, sin in the last.
One program per token covers all its q and k heads.
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
from kvserve.kernels.store_kv_cache import encode_kv


def rotate_reference(
    x: torch.Tensor,  # [T, H * D]
    positions: torch.Tensor,  # int64 [T]
    cos_sin_cache: torch.Tensor,  # float32 [max_pos, R], R <= D
    head_dim: int,
) -> torch.Tensor:
    """Out of place, in x's dtype: each head's leading R dims rotated (R = D but for
    partial-rotary models such as GLM-4.5), the rest passed through."""
    rot = cos_sin_cache.shape[1]
    half = rot // 2
    cos_sin = cos_sin_cache[positions]  # [T, R]
    cos, sin = cos_sin[:, None, :half], cos_sin[:, None, half:]
    heads = x.float().view(x.shape[0], -1, head_dim)  # [T, H, D]
    x1, x2 = heads[..., :half], heads[..., half:rot]
    rotated = (x1 * cos - x2 * sin, x2 * cos + x1 * sin, heads[..., rot:])
    return torch.cat(rotated, dim=-1).to(x.dtype).view_as(x)


def apply_rotary_reference(
    q: torch.Tensor,  # [T, Hq * D]
    k: torch.Tensor,  # [T, Hkv * D]
    positions: torch.Tensor,  # int64 [T]
    cos_sin_cache: torch.Tensor,  # float32 [max_pos, D]
    head_dim: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Out of place; returns new tensors in the inputs' dtypes."""
    return (
        rotate_reference(q, positions, cos_sin_cache, head_dim),
        rotate_reference(k, positions, cos_sin_cache, head_dim),
    )


@jit
def rotate_heads(
    src_ptr,
    dst_ptr,
    num_heads,
    src_stride_h,
    dst_stride_h,
    cos,
    sin,
    BLOCK_H: tl.constexpr,
    HALF: tl.constexpr,  # rotary dims / 2
    HEAD_DIM: tl.constexpr,
    norm_w_ptr=None,
    eps=0.0,
    inv_scale=1.0,
    QK_NORM: tl.constexpr = False,
    FP8: tl.constexpr = False,
):
    """Rotate ``num_heads`` heads of one token from ``src`` into ``dst`` (may be the same): the
    leading 2 * HALF dims of each head rotated, the rest passed through; first RMSNorm'd with
    ``norm_w_ptr`` when QK_NORM (Qwen3's q/k norm, ``rmsnorm.py``'s rounding). Rounded to
    src's dtype, then stored in dst's: an FP8 KV cache (FP8) times ``inv_scale``, clamped."""
    TAIL: tl.constexpr = HEAD_DIM - 2 * HALF
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, HALF)
    mask = (heads < num_heads)[:, None]
    src_heads = src_ptr + heads[:, None] * src_stride_h  # [BLOCK_H, 1]
    dst_heads = dst_ptr + heads[:, None] * dst_stride_h
    src, dst = src_heads + dims[None, :], dst_heads + dims[None, :]  # [BLOCK_H, HALF]
    dtype = src_ptr.dtype.element_ty
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    if TAIL > 0:
        tail = 2 * HALF + tl.arange(0, TAIL)[None, :]  # [1, TAIL]: the pass-through dims
        xt = tl.load(src_heads + tail, mask=mask, other=0.0).to(tl.float32)
    if QK_NORM:
        squares = tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)
        if TAIL > 0:
            squares += tl.sum(xt * xt, 1)
        rstd = tl.rsqrt(squares / HEAD_DIM + eps)[:, None]
        x1 = _normed(x1, rstd, norm_w_ptr + dims, dtype)
        x2 = _normed(x2, rstd, norm_w_ptr + HALF + dims, dtype)
        if TAIL > 0:
            xt = _normed(xt, rstd, norm_w_ptr + tail, dtype)
    y1 = (x1 * cos[None, :] - x2 * sin[None, :]).to(dtype)
    y2 = (x2 * cos[None, :] + x1 * sin[None, :]).to(dtype)
    out_dtype = dst_ptr.dtype.element_ty
    tl.store(dst, encode_kv(y1, inv_scale, FP8).to(out_dtype), mask=mask)
    tl.store(dst + HALF, encode_kv(y2, inv_scale, FP8).to(out_dtype), mask=mask)
    if TAIL > 0:
        tl.store(dst_heads + tail, encode_kv(xt.to(dtype), inv_scale, FP8).to(out_dtype), mask=mask)


@jit
def _normed(x, rstd, w_ptrs, dtype: tl.constexpr):
    """weight * (x * rstd) with RMSNorm's rounding: the normalized value rounded to the
    activations' dtype, then the product (``rmsnorm.py``)."""
    normed = (x * rstd).to(dtype).to(tl.float32)
    return (normed * tl.load(w_ptrs).to(tl.float32)).to(dtype).to(tl.float32)


@jit
def load_cos_sin(cos_sin_ptr, positions_ptr, t, stride_cs, HALF: tl.constexpr):
    """cos and sin ([D/2] each, fp32) at the position of token ``t``."""
    pos = tl.load(positions_ptr + t).to(tl.int64)
    dims = tl.arange(0, HALF)
    cos = tl.load(cos_sin_ptr + pos * stride_cs + dims)
    sin = tl.load(cos_sin_ptr + pos * stride_cs + HALF + dims)
    return cos, sin


@jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    positions_ptr,
    cos_sin_ptr,
    num_q_heads,
    num_kv_heads,
    stride_qt,
    stride_kt,
    stride_cs,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    HALF: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    pdl_release(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    cos, sin = load_cos_sin(cos_sin_ptr, positions_ptr, t, stride_cs, HALF)
    q = q_ptr + t * stride_qt
    k = k_ptr + t * stride_kt
    rotate_heads(q, q, num_q_heads, 2 * HALF, 2 * HALF, cos, sin, BLOCK_HQ, HALF, 2 * HALF)
    rotate_heads(k, k, num_kv_heads, 2 * HALF, 2 * HALF, cos, sin, BLOCK_HK, HALF, 2 * HALF)


def apply_rotary(
    q: torch.Tensor,  # [T, Hq * D]; rotated in place
    k: torch.Tensor,  # [T, Hkv * D]; rotated in place
    positions: torch.Tensor,  # int64 [T]
    cos_sin_cache: torch.Tensor,  # float32 [max_pos, D]
    head_dim: int,
    *,
    pdl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    require_triton()
    num_tokens = q.shape[0]
    assert head_dim % 2 == 0 and head_dim // 2 == next_pow2(head_dim // 2)
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and cos_sin_cache.stride(-1) == 1
    assert cos_sin_cache.dtype == torch.float32 and cos_sin_cache.shape[1] == head_dim
    if num_tokens == 0:
        return q, k
    num_q_heads, num_kv_heads = q.shape[1] // head_dim, k.shape[1] // head_dim
    _rotary_kernel[(num_tokens,)](
        q,
        k,
        positions,
        cos_sin_cache,
        num_q_heads,
        num_kv_heads,
        q.stride(0),
        k.stride(0),
        cos_sin_cache.stride(0),
        BLOCK_HQ=next_pow2(num_q_heads),
        BLOCK_HK=next_pow2(num_kv_heads),
        HALF=head_dim // 2,
        num_warps=4,
        **launch_options(pdl),
    )
    return q, k
