"""Decoding a tile of FP4 weight codes to floats in registers, shared by the FP4 GEMM
(``fp4_gemm.py``), the FP4 experts' grouped GEMM (``fused_moe_fp4.py``) and the dequantizing
kernel of large steps (``fp4_dequantize.py``).

Dequantization of one packed byte (two E2M1 codes ``s e1 e0 m``) takes bit operations only: the
code's three magnitude bits moved under an FP8 e4m3 byte's exponent/mantissa boundary give an
e4m3 number worth exactly ``value * 2**-6`` (the zero-exponent code lands on e4m3's subnormals,
which are exact), so ``(c & 7) << 2 | (c & 8) << 4`` is the e4m3 byte; the hardware converts it,
and the 2**6 is folded into the block scale. E2M1 times an e4m3 or power-of-two scale has at most
six significant bits, so the scaled weight is exact in bf16. By default the same trick runs on
32-bit words, eight codes at a time (``word_decode.fp4_word_to_halves``); bytes where W's rows
are not word-aligned and under Triton's interpreter (``code_words``).
"""

from __future__ import annotations

import torch

from kvserve.kernels._triton import interpreting, jit, next_pow2, tl
from kvserve.kernels.word_decode import fp4_word_to_halves


@jit
def _dequant_bytes(
    p,
    s,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP: tl.constexpr,
    SCALE_E8M0: tl.constexpr,
    DTYPE: tl.constexpr,
):
    """Packed codes p uint8 [BLOCK_N, BLOCK_K/2] and the raw bytes s uint8
    [BLOCK_N, BLOCK_K/GROUP] of the block scales -> the weight tile [BLOCK_N, BLOCK_K] in DTYPE,
    exact (without the row scale)."""
    lo = ((p & 0x07) << 2) | ((p & 0x08) << 4)
    hi = ((p >> 2) & 0x1C) | (p & 0x80)
    codes = tl.interleave(lo, hi)  # element 2j from the low nibble
    w = codes.to(tl.float8e4nv, bitcast=True).to(DTYPE)
    scale = _scale_times_64(s, SCALE_E8M0)
    w = tl.reshape(w, (BLOCK_N, BLOCK_K // GROUP, GROUP)) * scale.to(DTYPE)[:, :, None]
    return tl.reshape(w, (BLOCK_N, BLOCK_K))


@jit
def _scale_times_64(s, SCALE_E8M0: tl.constexpr):
    """Block scale bytes -> fp32 times 2**6 (the unit of the e4m3-decoded codes). Not
    ``word_decode._block_scale`` times 64: E8M0 takes the 6 as an integer add to its exponent,
    where the multiply cost MXFP4's loop 8-22 more sm_90 instructions (benchmarks/lowbit_sass)."""
    if SCALE_E8M0:
        # 2**(e - 127) * 2**6 built as fp32 bits; e == 0 gives 0 instead of 2**-121
        return ((s.to(tl.int32) + 6) << 23).to(tl.float32, bitcast=True)
    return s.to(tl.float8e4nv, bitcast=True).to(tl.float32) * 64.0


@jit
def _dequant_words(
    q,
    s,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP: tl.constexpr,
    SCALE_E8M0: tl.constexpr,
    DTYPE: tl.constexpr,
):
    """``_dequant_bytes`` from int32 words q [BLOCK_N, BLOCK_K / 8] (eight codes each, lowest
    nibble first): the codes decode eight at a time to f16, and the joins put them back in K
    order (code 4a + 2b + c at [a, b, c] of each word's 2 x 2 x 2)."""
    c0, c1, c2, c3, c4, c5, c6, c7 = fp4_word_to_halves(q)
    even = tl.join(tl.join(c0, c4), tl.join(c2, c6))
    odd = tl.join(tl.join(c1, c5), tl.join(c3, c7))
    w = tl.reshape(tl.join(even, odd), (BLOCK_N, BLOCK_K // GROUP, GROUP))
    scale = _scale_times_64(s, SCALE_E8M0)
    if SCALE_E8M0:  # powers of two beyond f16's range
        return tl.reshape((w.to(tl.float32) * scale[:, :, None]).to(DTYPE), (BLOCK_N, BLOCK_K))
    # code * 2**-6 times an e4m3 scale * 2**6 has six significant bits and lies in 2**-10 .. 2688:
    # exact in f16
    return tl.reshape((w * scale.to(tl.float16)[:, :, None]).to(DTYPE), (BLOCK_N, BLOCK_K))


@jit
def dequant_tile(
    p,
    s,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP: tl.constexpr,
    SCALE_E8M0: tl.constexpr,
    DTYPE: tl.constexpr,
    WORD_DEQUANT: tl.constexpr,
):
    """The weight tile from words (``_dequant_words``) or bytes (``_dequant_bytes``) of codes."""
    if WORD_DEQUANT:  # both branches written out: Triton compiles a statement after an if
        w = _dequant_words(p, s, BLOCK_N, BLOCK_K, GROUP, SCALE_E8M0, DTYPE)
    else:
        w = _dequant_bytes(p, s, BLOCK_N, BLOCK_K, GROUP, SCALE_E8M0, DTYPE)
    return w


@jit
def scale_tile(s_ptrs, k0, K, rg, GROUP: tl.constexpr, EVEN_K: tl.constexpr):
    """The block scales of the K step at ``k0``: [rows, BLOCK_K / GROUP] (zeros past K)."""
    if EVEN_K:
        s = tl.load(s_ptrs)
    else:
        s = tl.load(s_ptrs, mask=(k0 // GROUP + rg < K // GROUP)[None, :], other=0)
    return s


@jit
def first_scales(s_ptrs, k0, K, rg, GROUP: tl.constexpr, EVEN_K: tl.constexpr, AHEAD: tl.constexpr):
    """Before a K loop from ``k0``: its first step's scales where the loop loads them a step
    ahead (``AHEAD``, ``step_scales``), else nothing (0)."""
    s_ahead = 0
    if AHEAD:
        s_ahead = scale_tile(s_ptrs, k0, K, rg, GROUP, EVEN_K)
    return s_ahead


@jit
def step_scales(
    s_ahead, s_ptrs, k0, k_end, K, rg, GROUP: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, AHEAD: tl.constexpr,
):  # fmt: skip
    """The K step at ``k0``'s scales (``s_ptrs`` at its own) and, ``AHEAD``, the next step's,
    loaded now for the next step to use; at the last step its own again (in bounds, never
    used). Triton's pipeliner copies a step's scales ahead itself from 8 bytes a row (sm_90
    TTGIR); fewer (MXFP4 at 128-column steps) it leaves a plain load that each step waits for
    before its dequantization, so the kernels load them ahead where ``BLOCK_K // GROUP < 8``."""
    if AHEAD:
        s = s_ahead
        ahead = tl.where(k0 + BLOCK_K < k_end, BLOCK_K, 0)
        s_ahead = scale_tile(s_ptrs + ahead // GROUP, k0 + ahead, K, rg, GROUP, EVEN_K)
    else:
        s = scale_tile(s_ptrs, k0, K, rg, GROUP, EVEN_K)
    return s, s_ahead


# The most rows of x one tile of the FP4 MMA kernels takes (a decode step; prefill is more)
MAX_BLOCK_M = 128


def block_m_for(m: int) -> int:
    """Rows of x padded to a power of two from 16 to MAX_BLOCK_M: a tile's MMA N side."""
    return min(MAX_BLOCK_M, max(16, next_pow2(m)))


def code_words(packed: torch.Tensor) -> torch.Tensor:
    """The packed codes (uint8, K last and contiguous) as int32 words of eight codes where
    their rows allow it and the kernel runs compiled (the interpreter runs no inline PTX);
    else ``packed`` as is, for the byte dequant."""
    aligned = not (
        packed.shape[-1] % 4 or any(st % 4 for st in packed.stride()[:-1]) or packed.data_ptr() % 4
    )
    return packed.view(torch.int32) if aligned and not interpreting() else packed
