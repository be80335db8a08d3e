"""Operands of attention on FP8 tensor cores over an FP8 (e4m3) cache: q as e4m3 rows, p rounded
to e4m3 after a fixed factor.

q as one e4m3 row per token and head (its own scale) adds about as much error to the scores as
the keys' own rounding; as two (hi, and the remainder's rounding at its own scale) it adds
little, for one more FP8 MMA a tile. Both decode and prefill take one by default
(``KVSERVE_FP8_Q_TERMS``, ``q_terms_setting``): on the H200, decode at 32 x 32K in 1.86x
bf16's speed where two terms gave 1.77x, for 0.0055 RMS from exact attention against 0.0045,
where rounding the cache alone costs 0.0043, outputs of RMS 0.090
(fp8_kv_decode_h200_s50_q1_2026-12-04.json). vLLM's FP8 attention quantizes q with one scale
for the whole tensor. p is in [0, 1]: ``P_SCALE`` keeps its small values out of e4m3's
subnormals (decode undoes it with the value scale; prefill takes it in the exponent, so its row
sums carry it too). Used by ``fp8_decode_attention`` and by ``prefill_attention`` over an FP8
cache.
"""

from __future__ import annotations

import functools
import os

from kvserve.errors import ConfigError
from kvserve.kernels._triton import jit, tl

Q_TERMS_ENV = "KVSERVE_FP8_Q_TERMS"

P_LOG2 = tl.constexpr(8.0)
P_SCALE = tl.constexpr(256.0)  # 2 ** P_LOG2
E4M3_MAX = tl.constexpr(448.0)


@functools.cache
def q_terms_setting() -> int:
    """``KVSERVE_FP8_Q_TERMS``: q's e4m3 terms in attention over an FP8 cache, 1 (the default)
    or 2 (more exact scores, one more FP8 MMA a tile), for decode and prefill alike."""
    value = os.environ.get(Q_TERMS_ENV, "1")
    if value not in ("1", "2"):
        raise ConfigError(f"{Q_TERMS_ENV}={value!r}: expected 1 or 2")
    return int(value)


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
