"""The asynchronous-MMA FP4 GEMM's W decode (``fp4_async_gemm.py``): a step's code words in
registers to W in wgmma's A-operand layout, by one of two decodes, and x permuted to match.

Layout of a K step (128 columns). A thread of wgmma's A operand (bf16, ``k_width`` 2) holds, of
each row it owns, the column pairs ``16 kb + 8 h + 2 q + (0, 1)`` for kb < 8, h < 2, where q is
its lane in its quad. The thread loads instead the four words ``4 q .. 4 q + 3`` of the row (one
16-byte load): K index ``k = 32 q + 8 kbhi + 4 kblo + 2 h + e`` (word ``4 q + kbhi``, nibble
``4 kblo + 2 h + e``). It places that code at A column ``p = 32 kbhi + 16 kblo + 8 h + 2 q + e``,
a permutation of the step's K; x's columns arrive in the same permutation
(``fp4_step_order.permute_x_steps``: written so by x's producer, or one copy of x a call), so
the MMA's sum over K is unchanged. The decode, the scales and the
joins then never leave the thread: no shared-memory round trip for W.

Two decodes of a word's eight E2M1 codes to bf16: the e4m3 trick (conversions, then f16 pairs
moved to bf16), and bit placement (``BITS``), which pairs codes j and j + 4 and so takes x in
another permutation (``permute_x_steps(x, bits=True)``).
"""

from __future__ import annotations

from kvserve.kernels.fp4_step_order import STEP_K
from kvserve.kernels.word_decode import (
    FP4_WORD_REGISTERS,
    FP4_WORD_TO_F16X2_ASM,
    WORDS_TO_HALVES_OUT,
)

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.runtime.jit import constexpr_function

    HAS_GLUON = True
except ImportError:  # CPU-only install
    HAS_GLUON = False

STEP = gl.constexpr(STEP_K) if HAS_GLUON else STEP_K
W_ROWS_A_WARP = 16  # rows of W a warp owns in wgmma's A layout
ROWS_A_WARP = gl.constexpr(W_ROWS_A_WARP) if HAS_GLUON else W_ROWS_A_WARP


def jit(fn):  # noqa: ANN001, ANN202
    """``gluon.jit`` where Gluon is installed; the plain function on a CPU-only install."""
    return gluon.jit(fn) if HAS_GLUON else fn


def _constexpr_function(fn):  # noqa: ANN001, ANN202
    return constexpr_function(fn) if HAS_GLUON else fn


@_constexpr_function
def codes_layout(num_warps):  # noqa: ANN001, ANN201
    """int32 words [16 * num_warps, 16]: lane (r, q) of warp w holds rows 16 w + r and + 8,
    words 4 q .. 4 q + 3 (see the module docstring)."""
    warps = [[ROWS_A_WARP << i, 0] for i in range((num_warps - 1).bit_length())]
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [8, 0]],
        lane_bases=[[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]],
        warp_bases=warps,
        block_bases=[],
        shape=[ROWS_A_WARP * num_warps, 16],
    )


# Eight E2M1 codes of a word -> eight bf16 worth value * 2**-118, lowest nibble first: the e4m3
# trick (``word_decode``) to f16x2 pairs worth value * 2**-6, then each f16 pair to bf16 by
# moving the exponent and mantissa down 3 bits under the sign (bf16 value = f16 value * 2**-112).
# Exact for these values: normal f16 with exponent field 8..11, so its bit 2 (bit 12 / 28 of a
# pair, where the shift moves the sign) is 0 and the select takes it from the pair, and a
# mantissa of one bit, so no bits cross from the high f16 into the low one.
_FP4_WORD_TO_BF16 = (
    gl.constexpr(
        FP4_WORD_REGISTERS
        + FP4_WORD_TO_F16X2_ASM.format(q="$8")
        + """shr.b32 t0, w0, 3; lop3.b32 w0, t0, w0, 0x90009000, 0xD8;
        shr.b32 t0, w1, 3; lop3.b32 w1, t0, w1, 0x90009000, 0xD8;
        shr.b32 t0, w2, 3; lop3.b32 w2, t0, w2, 0x90009000, 0xD8;
        shr.b32 t0, w3, 3; lop3.b32 w3, t0, w3, 0x90009000, 0xD8;
        """
        + WORDS_TO_HALVES_OUT
    )
    if HAS_GLUON
    else None
)
# Eight E2M1 codes of a word -> eight bf16 worth value * 2**-126 by placing bits, no conversion:
# code j's sign goes to bit 15 and its exponent and mantissa bits (e1 e0 m) to bits 8..6 of the
# low half of register j % 4 (code j + 4: the high half, 16 bits up), so a bf16 of exponent
# field e and mantissa m, 2**(e - 127) * (1 + m / 2) = value * 2**-126 for e > 0, and the
# subnormal m * 2**-127 = value * 2**-126 for e = 0 (the bf16 multiply that follows keeps
# subnormals). Two shifts and two LOP3s a register, against the e4m3 trick's conversions and
# repairs. Outputs $0..$7 are codes 0..7, so a register pairs codes j and j + 4, which is the
# pair the A operand takes (``_decode_step``).
_FP4_WORD_TO_BF16_BITS = (
    gl.constexpr(
        """{ .reg .b32 a, b, w0, w1, w2, w3;
        shl.b32 a, $8, 6; shl.b32 b, $8, 12;
        and.b32 a, a, 0x01C001C0; and.b32 b, b, 0x80008000; or.b32 w0, a, b;
        shl.b32 a, $8, 2; shl.b32 b, $8, 8;
        and.b32 a, a, 0x01C001C0; and.b32 b, b, 0x80008000; or.b32 w1, a, b;
        shr.b32 a, $8, 2; shl.b32 b, $8, 4;
        and.b32 a, a, 0x01C001C0; and.b32 b, b, 0x80008000; or.b32 w2, a, b;
        shr.b32 a, $8, 6;
        and.b32 a, a, 0x01C001C0; and.b32 b, $8, 0x80008000; or.b32 w3, a, b;
        mov.b32 {$0, $4}, w0; mov.b32 {$1, $5}, w1; mov.b32 {$2, $6}, w2; mov.b32 {$3, $7}, w3; }"""
    )
    if HAS_GLUON
    else None
)
# The bit placement's codes are worth value * 2**-126, 2**8 less than the e4m3 trick's. An E8M0
# scale takes the 2**8 back (unit 2**126: the products are exact, down to E8M0 exponent 0, where
# 2**-118 would leave them below bf16's smallest subnormal); an e4m3 scale times 2**126 would
# overflow, so NVFP4's products stay worth value * 2**-8 and the sum is scaled back by 2**8 once,
# after the K loop.
BITS_UNIT_LOG2 = 8
BITS_SUM_SCALE = gl.constexpr(2.0**BITS_UNIT_LOG2) if HAS_GLUON else 2.0**BITS_UNIT_LOG2
# 2**118 (the unit of the e4m3 trick's codes, above) folded into the scales: NVFP4's e4m3 scale
# times it stays below bf16's largest (448 * 2**118 < 2**127); MXFP4's E8M0 scale 2**(e - 127)
# times it (times 2**8 more with ``BITS``) is bf16 with exponent field e + 118 (+ 8), exact up to
# e = 136 (128 with ``BITS``; ``max_e8m0``, checked by the caller).
CODE_UNIT_LOG2 = 118
_CODE_UNIT = gl.constexpr(CODE_UNIT_LOG2) if HAS_GLUON else CODE_UNIT_LOG2
_BITS_UNIT = gl.constexpr(BITS_UNIT_LOG2) if HAS_GLUON else BITS_UNIT_LOG2


def max_e8m0(bits: bool) -> int:
    """The largest MXFP4 scale exponent the kernel takes with or without ``bits``: the scale's
    bf16 exponent field (e plus the code unit) at most 254."""
    return 254 - CODE_UNIT_LOG2 - (BITS_UNIT_LOG2 if bits else 0)


@jit
def decode_step(q, s, SCALE_E8M0: gl.constexpr, BITS: gl.constexpr, A_LAYOUT: gl.constexpr):
    """Words q [BLOCK_N, 16] and each word's scale byte s -> W's step [BLOCK_N, 128] in the
    A-operand layout, columns in the step's permutation (``permute_x_steps(x, BITS)``)."""
    c0, c1, c2, c3, c4, c5, c6, c7 = gl.inline_asm_elementwise(
        asm=_FP4_WORD_TO_BF16_BITS if BITS else _FP4_WORD_TO_BF16,
        constraints="=h,=h,=h,=h,=h,=h,=h,=h,r",
        args=[q],
        dtype=(gl.bfloat16,) * 8,
        is_pure=True,
        pack=1,
    )
    if SCALE_E8M0:
        exponent = s.to(gl.int32) + _CODE_UNIT
        if BITS:
            exponent = exponent + _BITS_UNIT
        f = (exponent << 7).to(gl.int16).to(gl.bfloat16, bitcast=True)
    else:
        f = (s.to(gl.float8e4nv, bitcast=True).to(gl.float32) * 2.0**_CODE_UNIT).to(gl.bfloat16)
    # a code (at most 2 significant bits) times a scale (at most 4) is exact in bf16
    if BITS:  # a register's codes j and j + 4 as the pair: nibble 4 e + 2 kblo + h
        codes = _by_nibble(c0, c4, c1, c5, c2, c6, c3, c7)
    else:  # nibble 4 kblo + 2 h + e
        codes = _by_nibble(c0, c1, c2, c3, c4, c5, c6, c7)
    w = codes * _by_nibble(f, f, f, f, f, f, f, f)
    BLOCK_N: gl.constexpr = q.shape[0]
    w = gl.reshape(w, [BLOCK_N, 4, 4, 2, 2, 2])  # [n, q, kbhi, e, h, kblo]
    w = gl.permute(w, [0, 2, 5, 4, 1, 3])  # [n, kbhi, kblo, h, q, e]
    w = gl.reshape(w, [BLOCK_N, STEP])
    return gl.convert_layout(w, A_LAYOUT)


@jit
def _by_nibble(c0, c1, c2, c3, c4, c5, c6, c7):
    """Eight [BLOCK_N, 16] tensors, argument e + 2 h + 4 kblo, joined into
    [BLOCK_N, 16, e, h, kblo] (each thread's own registers)."""
    return gl.join(
        gl.join(gl.join(c0, c1), gl.join(c2, c3)), gl.join(gl.join(c4, c5), gl.join(c6, c7))
    )
