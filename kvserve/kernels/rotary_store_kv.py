"""Rotary on q and k plus the paged-KV store, fused into one kernel reading the qkv GEMM output.

Replaces, on the Triton path, the ``.contiguous()`` copies of the q/k/v split views, the rotary
kernel (``rotary.py``) and the store kernel (``store_kv_cache.py``): q is rotated into a
contiguous ``[T, Hq, D]`` output, k is rotated straight into ``kv_cache[0]`` and v copied into
``kv_cache[1]`` at ``slot_mapping[t]``. A negative slot marks a padding row (CUDA-graph batch):
its q is still written, the cache is left untouched. One program per token, the grid depends only
on T, so the launch is graph-capturable.

Two model features ride along, so that Qwen3 (q/k RMSNorm per head before rotary) and GLM-4.5
(rotary over the first ``rotary_dim`` of each head's dims, the rest passed through) take the
fused kernel too: ``QKNorm`` normalizes each q and k head with Hugging Face's RMSNorm rounding
(``rmsnorm.py``) before it is rotated, and a ``rotary_dim`` below ``head_dim`` rotates only the
leading dims.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvserve.kernels._triton import (
    early_loads,
    jit,
    launch_options,
    next_pow2,
    pdl_release,
    pdl_wait,
    require_triton,
    tl,
)
from kvserve.kernels.rmsnorm import rms_norm_reference
from kvserve.kernels.rotary import load_cos_sin, rotate_heads, rotate_reference
from kvserve.kernels.store_kv_cache import (
    KVScales,
    cache_keys,
    is_fp8_kv,
    load_inv_scales,
    scale_args,
    store_kv_cache_reference,
    store_token_values,
)


@dataclass(frozen=True)
class QKNorm:
    """Per-head RMSNorm of q and k before rotary (Qwen3's ``q_norm`` / ``k_norm``)."""

    q_weight: torch.Tensor  # [D]
    k_weight: torch.Tensor  # [D]
    eps: float


def rotary_store_kv_reference(
    qkv: torch.Tensor,  # [T, (Hq + 2 * Hkv) * D]
    positions: torch.Tensor,  # int64 [T]
    cos_sin_cache: torch.Tensor,  # float32 [max_pos, rotary_dim]
    kv_cache: torch.Tensor,  # [2, num_pages, page_size, Hkv, D]; written in place
    slot_mapping: torch.Tensor,  # int64 [T]; < 0 = padding row, not stored
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    kv_scales: KVScales | None = None,
    qk_norm: QKNorm | None = None,
) -> torch.Tensor:  # [T, Hq, D]
    q_size, kv_size = num_q_heads * head_dim, num_kv_heads * head_dim
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    if qk_norm is not None:
        w_q, w_k, eps = qk_norm.q_weight, qk_norm.k_weight, qk_norm.eps
        q = rms_norm_reference(q.reshape(-1, head_dim), w_q, eps).view(q.shape)
        k = rms_norm_reference(k.reshape(-1, head_dim), w_k, eps).view(k.shape)
    q = rotate_reference(q, positions, cos_sin_cache, head_dim)
    k = rotate_reference(k, positions, cos_sin_cache, head_dim)
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
    q_norm_ptr,
    k_norm_ptr,
    eps,
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
    HEAD_DIM: tl.constexpr,
    QK_NORM: tl.constexpr,
    FP8: tl.constexpr,
    USE_PDL: tl.constexpr,
    EARLY_LOADS: tl.constexpr,  # positions, rotary table and slot before the wait (not qkv)
):
    if not EARLY_LOADS:
        pdl_wait(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    cos, sin = load_cos_sin(cos_sin_ptr, positions_ptr, t, stride_cs, HALF)
    slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
    if EARLY_LOADS:
        pdl_wait(USE_PDL)
    pdl_release(USE_PDL)
    q_src = qkv_ptr + t * stride_qkv_t
    q_dst = q_out_ptr + t * stride_qo_t
    rotate_heads(
        q_src, q_dst, num_q_heads, HEAD_DIM, stride_qo_h, cos, sin, BLOCK_HQ, HALF, HEAD_DIM,
        q_norm_ptr, eps, 1.0, QK_NORM,
    )  # fmt: skip
    if slot >= 0:
        k_inv, v_inv = load_inv_scales(k_scale_ptr, v_scale_ptr, FP8)
        page, in_page = slot // page_size, slot % page_size
        dst = page * stride_cache_page + in_page * stride_cache_tok
        k_src = q_src + num_q_heads * HEAD_DIM
        v_src = k_src + num_kv_heads * HEAD_DIM
        rotate_heads(
            k_src, k_cache_ptr + dst, num_kv_heads, HEAD_DIM, stride_cache_head, cos, sin,
            BLOCK_HK, HALF, HEAD_DIM, k_norm_ptr, eps, k_inv, QK_NORM, FP8,
        )  # fmt: skip
        store_token_values(
            v_src, v_cache_ptr, page, in_page, num_kv_heads, HEAD_DIM, page_size,
            stride_cache_page, stride_cache_tok, stride_cache_head, v_inv, BLOCK_HK, HEAD_DIM,
            FP8,
        )  # fmt: skip


def fusable(rotary_dim: int, head_dim: int) -> bool:
    """Whether the kernel takes these head shapes: half the rotary dims and the pass-through
    dims (if any) powers of two."""
    half, tail = rotary_dim // 2, head_dim - rotary_dim
    pow2 = half > 0 and half == next_pow2(half) and rotary_dim % 2 == 0
    return pow2 and tail >= 0 and (tail == 0 or tail == next_pow2(tail))


def _check_inputs(
    qkv: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    kv_cache: torch.Tensor,
    q_out: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
) -> None:
    assert fusable(cos_sin_cache.shape[1], head_dim), "rotary / pass-through dims"
    assert qkv.shape[1] == (num_q_heads + 2 * num_kv_heads) * head_dim, "qkv width mismatch"
    assert qkv.stride(1) == 1, "qkv rows must be contiguous (the row stride may be wider)"
    assert cos_sin_cache.dtype == torch.float32 and cos_sin_cache.stride(1) == 1
    assert kv_cache.shape[-2:] == (num_kv_heads, head_dim), "k/v heads do not match the cache"
    assert kv_cache.stride(-1) == 1
    assert q_out.shape == (qkv.shape[0], num_q_heads, head_dim) and q_out.stride(-1) == 1


def rotary_store_kv(
    qkv: torch.Tensor,  # [T, (Hq + 2 * Hkv) * D]; read through its strides
    positions: torch.Tensor,  # int64 [T]
    cos_sin_cache: torch.Tensor,  # float32 [max_pos, rotary_dim]: cos | sin
    kv_cache: torch.Tensor,  # [2, num_pages, page_size, Hkv, D]; written in place
    slot_mapping: torch.Tensor,  # int64 [T]; < 0 = padding row, not stored
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    q_out: torch.Tensor | None = None,  # [T, Hq, D]
    kv_scales: KVScales | None = None,  # needed by an FP8 cache
    qk_norm: QKNorm | None = None,
    *,
    pdl: bool = False,
) -> torch.Tensor:
    """Rotated q as ``q_out`` (allocated when None); rotated k and plain v go to the cache.
    The rotary dim is ``cos_sin_cache``'s width; dims past it pass through."""
    require_triton()
    num_tokens = qkv.shape[0]
    if q_out is None:
        q_out = qkv.new_empty(num_tokens, num_q_heads, head_dim)
    _check_inputs(qkv, cos_sin_cache, kv_cache, q_out, num_q_heads, num_kv_heads, head_dim)
    if num_tokens == 0:
        return q_out
    k_cache, v_cache = cache_keys(kv_cache), kv_cache[1]  # keys [pages, page, Hkv, D]
    _rotary_store_kv_kernel[(num_tokens,)](
        qkv,
        positions,
        cos_sin_cache,
        q_out,
        k_cache,
        v_cache,
        slot_mapping,
        *scale_args(kv_cache, kv_scales),
        qk_norm.q_weight if qk_norm else q_out,
        qk_norm.k_weight if qk_norm else q_out,
        qk_norm.eps if qk_norm else 0.0,
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
        HALF=cos_sin_cache.shape[1] // 2,
        HEAD_DIM=head_dim,
        QK_NORM=qk_norm is not None,
        FP8=is_fp8_kv(kv_cache),
        EARLY_LOADS=early_loads(pdl),
        num_warps=4,
        **launch_options(pdl),
    )
    return q_out
