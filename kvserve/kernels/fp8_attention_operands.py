"""Operands of attention on FP8 tensor cores over an FP8 (e4m3) cache: q as two e4m3 rows and
p rounded to e4m3 after a fixed factor.

q as e4m3 alone would add about as much error to the scores as the keys' own rounding, so it is
split into hi (q rounded to e4m3 at its row's scale) and the remainder's e4m3 rounding at its own
scale; the second product costs one more FP8 MMA. p is in [0, 1]: ``P_SCALE`` keeps its small
values out of e4m3's subnormals, and is undone with the value scale. Used by
``fp8_decode_attention`` and by ``prefill_attention``'s ``FP8_TENSOR_CORES`` mode.
"""

from __future__ import annotations

from kvserve.kernels._triton import jit, tl

P_LOG2 = tl.constexpr(8.0)
P_SCALE = tl.constexpr(256.0)  # 2 ** P_LOG2
E4M3_MAX = tl.constexpr(448.0)


@jit
def to_e4m3_rows(x):
    """x [R, C] fp32 as e4m3 rows and their scales: x ~ e4m3 * scale[:, None]."""
    amax = tl.max(tl.abs(x), 1)
    scale = tl.where(amax > 0, amax / E4M3_MAX, 1.0)
    return (x / scale[:, None]).to(tl.float8e4nv), scale


@jit
def e4m3_query_rows(x, score_scale, TERMS: tl.constexpr):
    """``split_e4m3_rows`` with TERMS = 2; with 1, x rounded to e4m3 alone (lo is hi, its
    scale 0)."""
    if TERMS == 2:
        return split_e4m3_rows(x, score_scale)
    hi, hi_scale = to_e4m3_rows(x)
    return hi, hi, hi_scale * score_scale, hi_scale * 0.0


@jit
def split_e4m3_rows(x, score_scale):
    """x [R, C] fp32 as hi + lo e4m3 rows: x ~ hi * hi_scale[:, None] + lo * lo_scale[:, None],
    both scales times ``score_scale`` (the factor every score is taken at)."""
    hi, hi_scale = to_e4m3_rows(x)
    lo, lo_scale = to_e4m3_rows(x - hi.to(tl.float32) * hi_scale[:, None])
    return hi, lo, hi_scale * score_scale, lo_scale * score_scale
