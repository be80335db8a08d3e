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


def apply_rotary_reference(
    q: torch.Tensor,  # [T, Hq * D]
    k: torch.Tensor,  # [T, Hkv * D]
    positions: torch.Tensor,  # int64 [T]
    cos_sin_cache: torch.Tensor,  # float32 [max_pos, D]
    head_dim: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Out of place; returns new tensors in the inputs' dtypes."""
    half = head_dim // 2
    cos_sin = cos_sin_cache[positions]  # [T, D]
    cos, sin = cos_sin[:, None, :half], cos_sin[:, None, half:]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        xh = x.float().view(x.shape[0], -1, head_dim)  # [T, H, D]
        x1, x2 = xh[..., :half], xh[..., half:]
        rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        return rotated.to(x.dtype).view_as(x)

    return rotate(q), rotate(k)


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
    HALF: tl.constexpr,
    inv_scale=1.0,
    FP8: tl.constexpr = False,
):
    """Rotate ``num_heads`` heads of one token from ``src`` into ``dst`` (may be the same).
    ``FP8``: ``dst`` is an FP8 KV cache, stored times ``inv_scale`` and clamped to its range."""
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, HALF)
    mask = (heads < num_heads)[:, None]
    src = src_ptr + heads[:, None] * src_stride_h + dims[None, :]  # [BLOCK_H, D/2]
    dst = dst_ptr + heads[:, None] * dst_stride_h + dims[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    dtype = dst_ptr.dtype.element_ty
    y1 = x1 * cos[None, :] - x2 * sin[None, :]
    y2 = x2 * cos[None, :] + x1 * sin[None, :]
    if FP8:
        y1 = tl.clamp(y1 * inv_scale, -448.0, 448.0)
        y2 = tl.clamp(y2 * inv_scale, -448.0, 448.0)
    tl.store(dst, y1.to(dtype), mask=mask)
    tl.store(dst + HALF, y2.to(dtype), mask=mask)


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
    rotate_heads(q, q, num_q_heads, 2 * HALF, 2 * HALF, cos, sin, BLOCK_HQ, HALF)
    rotate_heads(k, k, num_kv_heads, 2 * HALF, 2 * HALF, cos, sin, BLOCK_HK, HALF)


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
