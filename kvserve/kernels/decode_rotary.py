"""Rotary (with Qwen3's q/k norm and GLM-4.5's partial rotary) and the store of the newest k and
v, folded into the decode attention kernel (``decode_attention.py``) for decode-only steps: it
reads q, k and v straight from the qkv projection's output, rotates q in registers, and the split
that holds the newest token rotates that token's k, stores k and v into the paged cache and adds
them to its softmax from registers (its loop stops before that token). So a decode step's layer
runs one kernel fewer than with ``rotary_store_kv.py`` before the attention kernel.

Rotate-half as one product per dim: ``out[d] = x[d] * cos[d] + x[partner(d)] * sin[d]``, with
partner(d) = d + R/2 and sin negated over the first R/2 dims, d - R/2 over the next R/2, and
cos = 1, sin = 0 on the pass-through dims past R (``rotary_factors``). The values are rounded
as ``rotary.rotate_heads`` rounds them; the newest token's score is summed over D in fp32 where
the loop's MMA sums in another order.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from kvserve.config import env_switch
from kvserve.kernels._triton import jit, tl
from kvserve.kernels.rotary import _normed
from kvserve.kernels.rotary_store_kv import QKNorm
from kvserve.kernels.store_kv_cache import encode_kv, load_inv_scales

DECODE_ROTARY_ENV = "KVSERVE_DECODE_ROTARY"


@functools.cache
def decode_rotary_enabled() -> bool:
    """``KVSERVE_DECODE_ROTARY``: 1 folds rotary and the newest k/v's store into the decode
    attention kernel on decode-only steps (``decode_rotary.py``); 0 (the default) runs
    ``rotary_store_kv`` before it. Off until its GPU tests and an engine A/B have run (s43 got
    no machine after it was written)."""
    return env_switch(DECODE_ROTARY_ENV, default=False)


@dataclass(frozen=True)
class DecodeRotary:
    """What the decode kernel needs to rotate and store a step's new rows itself."""

    qkv: torch.Tensor  # [B, (Hq + 2 * Hkv) * D], unit column stride
    positions: torch.Tensor  # int64 [B]
    cos_sin_cache: torch.Tensor  # float32 [max_pos, R]: cos | sin
    slot_mapping: torch.Tensor  # int64 [B]; < 0: a padding row, nothing stored
    qk_norm: QKNorm | None = None

    def q_view(self, num_heads: int, head_dim: int) -> torch.Tensor:
        """q's heads [B, Hq, D] as a view of each qkv row (k and v follow them in the row)."""
        assert self.qkv.stride(1) == 1 and self.cos_sin_cache.stride(1) == 1
        return self.qkv[:, : num_heads * head_dim].view(-1, num_heads, head_dim)


@jit
def rotary_factors(cos_sin_ptr, pos, stride_cs, HALF: tl.constexpr, HEAD_DIM: tl.constexpr):
    """cos, signed sin and the partner dim of each of a head's dims, [1, HEAD_DIM] each, at
    position ``pos``."""
    dims = tl.arange(0, HEAD_DIM)
    rotated = dims < 2 * HALF
    first = dims < HALF
    j = tl.where(first, dims, dims - HALF)
    row = cos_sin_ptr + pos.to(tl.int64) * stride_cs
    cos = tl.load(row + j, mask=rotated, other=1.0)
    sin = tl.load(row + HALF + j, mask=rotated, other=0.0)
    sin = tl.where(first, -sin, sin)
    partner = tl.where(rotated, tl.where(first, dims + HALF, dims - HALF), dims)
    return cos[None, :], sin[None, :], partner[None, :]


@jit
def rotated_rows(
    rows, row_mask, cos, sin, partner, norm_ptr, eps, QK_NORM: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):  # fmt: skip
    """Heads at ``rows`` ([R, 1] pointers to their first dim) rotated, [R, HEAD_DIM] in their
    own dtype, RMSNorm'd first with ``norm_ptr`` when QK_NORM (``rotary.rotate_heads``)."""
    dims = tl.arange(0, HEAD_DIM)[None, :]
    dtype = rows.dtype.element_ty
    x = tl.load(rows + dims, mask=row_mask, other=0.0).to(tl.float32)
    xp = tl.load(rows + partner, mask=row_mask, other=0.0).to(tl.float32)
    if QK_NORM:
        rstd = tl.rsqrt(tl.sum(x * x, 1) / HEAD_DIM + eps)[:, None]
        x = _normed(x, rstd, norm_ptr + dims, dtype)
        xp = _normed(xp, rstd, norm_ptr + partner, dtype)
    return (x * cos + xp * sin).to(dtype)


@jit
def attend_one(q, k, v, m_i, l_i, acc, scale_log2):
    """One key and value ([1, D], in the MMA operands' dtype) into the online softmax of q's
    rows, rounded as the tile MMAs round (p to v's dtype)."""
    s = tl.sum(q.to(tl.float32) * k.to(tl.float32), 1)  # [BLOCK_H], unscaled
    m_new = tl.maximum(m_i, s * scale_log2)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s * scale_log2 - m_new)
    l_i = l_i * alpha + p
    pv = p.to(v.dtype).to(tl.float32)[:, None] * v.to(tl.float32)
    return m_new, l_i, acc * alpha[:, None] + pv


@jit
def store_and_attend_newest(
    k_src, v_src, k_dst, v_dst, slot_ok, q, m_i, l_i, acc, scale_log2, cos, sin, partner,
    k_norm_ptr, eps, k_scale_ptr, v_scale_ptr, QK_NORM: tl.constexpr, FP8: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):  # fmt: skip
    """The newest token's k (rotated) and v, read from its qkv row at ``k_src`` / ``v_src``:
    stored at ``k_dst`` / ``v_dst`` in the cache (when ``slot_ok``) as ``rotary_store_kv``
    stores them, and added to q's softmax as the cache holds them (an FP8 cache's values
    widened to q's dtype, as the loop widens its tiles)."""
    dims = tl.arange(0, HEAD_DIM)[None, :]
    one_row = tl.full([1, 1], 1, tl.int1)
    k = rotated_rows(k_src + tl.zeros([1, 1], tl.int32), one_row, cos, sin, partner,
                     k_norm_ptr, eps, QK_NORM, HEAD_DIM)  # fmt: skip
    v = tl.load(v_src + dims)
    k_inv, v_inv = load_inv_scales(k_scale_ptr, v_scale_ptr, FP8)
    k = encode_kv(k, k_inv, FP8).to(k_dst.dtype.element_ty)
    v = encode_kv(v, v_inv, FP8).to(v_dst.dtype.element_ty)
    if slot_ok:
        tl.store(k_dst + dims, k)
        tl.store(v_dst + dims, v)
    return attend_one(q, k.to(q.dtype), v.to(q.dtype), m_i, l_i, acc, scale_log2)
