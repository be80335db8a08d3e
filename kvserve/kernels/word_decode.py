"""In-register pieces of the word GEMV (``word_gemv.py``): 32-bit words of FP4 codes or e4m3
bytes decoded to floats, x fetched in the matching order, and one K step of one row of x.
The decoding tricks and their exactness are described in ``word_gemv.py``'s docstring."""

from __future__ import annotations

from kvserve.kernels._triton import constexpr, jit, tl

# The units the partial sums come out in, as powers of two multiplied back at the end:
# FP4 codes read as e4m3 bytes are worth value * 2**-6; the packed path's x pairs, x * 2**-4.
E4M3_CODE_LOG2 = constexpr(6)
X_PAIR_LOG2 = constexpr(4)


@jit
def _e4m3_bytes_of_fp4(q):
    """Eight E2M1 codes a word -> (e4m3 bytes of codes 0, 2, 4, 6; of codes 1, 3, 5, 7)."""
    even = ((q & 0x07070707) << 2) | ((q & 0x08080808) << 4)
    odd = ((q >> 2) & 0x1C1C1C1C) | (q & -2139062144)  # 0x80808080 as an int32
    return even, odd


@jit
def _e4m3x4_to_f32(word, USE_ASM: tl.constexpr):
    """The four e4m3 bytes of a word, lowest first, as fp32."""
    if USE_ASM:
        return tl.inline_asm_elementwise(
            asm="""{ .reg .b16 lo, hi, l0, l1, h0, h1; .reg .b32 lf, hf;
            mov.b32 {lo, hi}, $4;
            cvt.rn.f16x2.e4m3x2 lf, lo;
            cvt.rn.f16x2.e4m3x2 hf, hi;
            mov.b32 {l0, l1}, lf;
            mov.b32 {h0, h1}, hf;
            cvt.f32.f16 $0, l0; cvt.f32.f16 $1, l1; cvt.f32.f16 $2, h0; cvt.f32.f16 $3, h1; }""",
            constraints="=f,=f,=f,=f,r",
            args=[word],
            dtype=(tl.float32, tl.float32, tl.float32, tl.float32),
            is_pure=True,
            pack=1,
        )
    # Triton's interpreter runs no PTX: the same conversion, a byte at a time
    return (
        _byte_to_f32(word, 0),
        _byte_to_f32(word, 1),
        _byte_to_f32(word, 2),
        _byte_to_f32(word, 3),
    )


@jit
def _byte_to_f32(word, B: tl.constexpr):
    return (word >> (8 * B)).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)


@jit
def _halves_to_f32(word, BF16: tl.constexpr):
    """The two 16-bit weights of a word, lowest first, as fp32 (exact): bf16 by moving its bits
    into an fp32's top half, fp16 by converting."""
    if BF16:
        lo = (word << 16).to(tl.float32, bitcast=True)
        hi = (word & -65536).to(tl.float32, bitcast=True)  # 0xFFFF0000 as an int32
    else:
        lo = word.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        hi = (word >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@jit
def _block_scale(s, SCALE_E8M0: tl.constexpr):
    """Block scale bytes -> fp32 (E8M0: 2**(e - 127) as fp32 bits; e == 0 gives 0 instead of
    2**-127). The partial sums come out in units of 2**-LOG2_UNIT, multiplied back once at the
    end (``_times_unit``)."""
    if SCALE_E8M0:
        return (s.to(tl.int32) << 23).to(tl.float32, bitcast=True)
    return s.to(tl.float8e4nv, bitcast=True).to(tl.float32)


@jit
def _times_unit(tile, FP4: tl.constexpr, LOG2_UNIT: tl.constexpr):
    """FP4's finished sums times 2**LOG2_UNIT, the unit the decoded codes (and x pairs) are in."""
    if FP4:
        tile = tile * (1 << LOG2_UNIT)
    return tile


@jit
def _scale_bytes(ptrs, mask, fallback, ASM_LOADS: tl.constexpr):
    """The block scale bytes at ``ptrs`` (``GemvConfig.asm_scale_loads``)."""
    if ASM_LOADS:
        safe = tl.where(mask, ptrs, fallback)  # masked lanes read a valid byte, never used
        return tl.inline_asm_elementwise(
            "ld.global.nc.u8 $0, [$1];", "=r,l", [safe], dtype=tl.int32, is_pure=True, pack=1
        ).to(tl.uint8)
    return tl.load(ptrs, mask=mask, other=0)


@jit
def _groups_in(w_first, rg, w_end, WORDS_PER_GROUP: tl.constexpr):
    """[1, BLOCK_G] mask: the scale groups of a K step that start before w_end."""
    return (w_first // WORDS_PER_GROUP + rg < w_end // WORDS_PER_GROUP)[None, :]


@jit
def _x_at(x_ptr, row, stride_xm, M, k_index, mask):
    """x[row, k_index] in fp32, [1, BLOCK_W]; rows past M read row 0 (never stored)."""
    r = tl.where(row < M, row, 0).to(tl.int64)
    return tl.load(x_ptr + r * stride_xm + k_index, mask=mask, other=0.0).to(tl.float32)[None, :]


@jit
def _fp4_row_part(x_ptr, row, stride_xm, M, k8, mask, e0, e1, e2, e3, o0, o1, o2, o3):
    """sum over the 8 codes of each word of w * x[row]: [BLOCK_N, BLOCK_W]. Code j of word w
    is k = 8w + j; e_i holds code 2i, o_i code 2i + 1."""
    part = e0 * _x_at(x_ptr, row, stride_xm, M, k8, mask)
    part += o0 * _x_at(x_ptr, row, stride_xm, M, k8 + 1, mask)
    part += e1 * _x_at(x_ptr, row, stride_xm, M, k8 + 2, mask)
    part += o1 * _x_at(x_ptr, row, stride_xm, M, k8 + 3, mask)
    part += e2 * _x_at(x_ptr, row, stride_xm, M, k8 + 4, mask)
    part += o2 * _x_at(x_ptr, row, stride_xm, M, k8 + 5, mask)
    part += e3 * _x_at(x_ptr, row, stride_xm, M, k8 + 6, mask)
    part += o3 * _x_at(x_ptr, row, stride_xm, M, k8 + 7, mask)
    return part


@jit
def _fp8_row_part(x_ptr, row, stride_xm, M, k4, mask, w0, w1, w2, w3):
    """sum over the 4 values of each word of w * x[row]: [BLOCK_N, BLOCK_W]."""
    part = w0 * _x_at(x_ptr, row, stride_xm, M, k4, mask)
    part += w1 * _x_at(x_ptr, row, stride_xm, M, k4 + 1, mask)
    part += w2 * _x_at(x_ptr, row, stride_xm, M, k4 + 2, mask)
    part += w3 * _x_at(x_ptr, row, stride_xm, M, k4 + 3, mask)
    return part


# One x word pair's 16 activations -> the eight f16x2 operands of its codes, times 2**-4 (see
# _fp4_pair_dots for the order). bf16 widens exactly to fp32, is scaled there (activations up to
# 2**20 stay inside f16 after the product sums), then rounds to f16; fp16 is scaled in f16.
_X_BF16_PAIR = """shl.b32 lo, {a}, 16; shl.b32 hi, {b}, 16;
        mul.f32 lo, lo, 0f3D800000; mul.f32 hi, hi, 0f3D800000; cvt.rn.f16x2.f32 {out0}, hi, lo;
        and.b32 lo, {a}, 0xFFFF0000; and.b32 hi, {b}, 0xFFFF0000;
        mul.f32 lo, lo, 0f3D800000; mul.f32 hi, hi, 0f3D800000; cvt.rn.f16x2.f32 {out1}, hi, lo;"""
_X_F16_PAIR = """prmt.b32 lo, {a}, {b}, 0x5410; mul.rn.f16x2 {out0}, lo, sixteenth;
        prmt.b32 hi, {a}, {b}, 0x7632; mul.rn.f16x2 {out1}, hi, sixteenth;"""


def _x_pairs_asm(bf16: bool) -> str:
    """PTX: x[16p .. 16p + 15] loaded from $8 as eight 32-bit words a0..a7 (two 16-bit x each,
    lowest first); out: $0..$3 word 2p's (x0, x2), (x4, x6), (x1, x3), (x5, x7), $4..$7 word
    2p + 1's."""
    pair = _X_BF16_PAIR if bf16 else _X_F16_PAIR
    body = []
    for word in range(2):
        a = [f"a{4 * word + i}" for i in range(4)]
        out = [f"${4 * word + i}" for i in range(4)]
        # (x0, x2) and (x1, x3) come from a0, a1; (x4, x6) and (x5, x7) from a2, a3
        body.append(pair.format(a=a[0], b=a[1], out0=out[0], out1=out[2]))
        body.append(pair.format(a=a[2], b=a[3], out0=out[1], out1=out[3]))
    return (
        "{ .reg .b32 a0, a1, a2, a3, a4, a5, a6, a7, lo, hi, sixteenth;\n"
        "mov.b32 sixteenth, 0x2C002C00;\n"
        "ld.global.nc.v4.u32 {a0, a1, a2, a3}, [$8];\n"
        "ld.global.nc.v4.u32 {a4, a5, a6, a7}, [$8+16];\n" + "\n".join(body) + " }"
    )


X_BF16_PAIRS_ASM = constexpr(_x_pairs_asm(True))
X_F16_PAIRS_ASM = constexpr(_x_pairs_asm(False))


@jit
def _x_word_pairs(x_ptr, row, stride_xm, M, pair, X_BF16: tl.constexpr):
    """The f16x2 operands of x row ``row`` for word pairs ``pair`` [1, P] (words 2p, 2p + 1;
    ``_fp4_pair_dots``): eight int32 tensors [1, P]. x's rows are 16-byte aligned."""
    r = tl.where(row < M, row, 0).to(tl.int64)
    ptrs = x_ptr + r * stride_xm + pair * 16
    return tl.inline_asm_elementwise(
        asm=X_BF16_PAIRS_ASM if X_BF16 else X_F16_PAIRS_ASM,
        constraints="=r,=r,=r,=r,=r,=r,=r,=r,l",
        args=[ptrs],
        dtype=(tl.int32,) * 8,
        is_pure=True,
        pack=1,
    )


# Eight E2M1 codes of word {q} -> e4m3 bytes worth value * 2**-6 (the e4m3 trick, word_gemv.py):
# ev holds codes 0, 2, 4, 6 (low nibbles), od codes 1, 3, 5, 7.
E4M3_BYTES_ASM = """and.b32 t0, {q}, 0x07070707; shl.b32 t0, t0, 2;
        and.b32 t1, {q}, 0x08080808; shl.b32 t1, t1, 4;
        or.b32 ev, t0, t1;
        shr.b32 t0, {q}, 2; and.b32 t0, t0, 0x1C1C1C1C;
        and.b32 t1, {q}, 0x80808080;
        or.b32 od, t0, t1;
        """
# Eight E2M1 codes of a word -> four f16x2 weights (value * 2**-6): even codes 0/2 and 4/6, odd
# 1/3 and 5/7, as cvt.rn.f16x2.e4m3x2 pairs a word's bytes (the e4m3 trick, word_gemv.py).
_DECODE_WORD = (
    E4M3_BYTES_ASM
    + """mov.b32 {{e_lo, e_hi}}, ev;
        mov.b32 {{o_lo, o_hi}}, od;
        cvt.rn.f16x2.e4m3x2 w0, e_lo;
        cvt.rn.f16x2.e4m3x2 w1, e_hi;
        cvt.rn.f16x2.e4m3x2 w2, o_lo;
        cvt.rn.f16x2.e4m3x2 w3, o_hi;"""
)


def _f16x2_chain(first_x: int, start: bool) -> str:
    """PTX: acc (+)= w0 * $first_x + w1 * $(first_x + 1) + ... + w3 * $(first_x + 3) in f16x2."""
    terms = [f"fma.rn.f16x2 acc, w{i}, ${first_x + i}, acc;" for i in range(4)]
    if start:
        terms[0] = f"mul.rn.f16x2 acc, w0, ${first_x};"
    return "\n" + "\n".join(terms) + "\n"


# the chain's two lanes as fp32 outputs $0 and $1, and the end of the asm block
_LANES_TO_F32 = "mov.b32 {a_lo, a_hi}, acc; cvt.f32.f16 $0, a_lo; cvt.f32.f16 $1, a_hi; }"
FP4_PAIR_DOTS_ASM = constexpr(
    "{ .reg .b32 ev, od, t0, t1, w0, w1, w2, w3, acc;\n"
    ".reg .b16 e_lo, e_hi, o_lo, o_hi, a_lo, a_hi;\n"
    + _DECODE_WORD.format(q="$2")
    + _f16x2_chain(4, start=True)
    + _DECODE_WORD.format(q="$3")
    + _f16x2_chain(8, start=False)
    + _LANES_TO_F32
)


# The e4m3 bytes of codes 0-3 and 4-7 in K order (prmt picks bytes: ev's are codes 0, 2, 4, 6,
# od's 1, 3, 5, 7), so that each f16x2 from the conversion is two K-adjacent weights: w0 codes
# 0 and 1, .. w3 codes 6 and 7. Registers: ev, od, t0, t1, lo, hi, w0-w3 (b32), l_lo, l_hi,
# h_lo, h_hi (b16).
FP4_WORD_TO_F16X2_ASM = (
    E4M3_BYTES_ASM
    + """prmt.b32 lo, ev, od, 0x5140;
        prmt.b32 hi, ev, od, 0x7362;
        mov.b32 {{l_lo, l_hi}}, lo;
        mov.b32 {{h_lo, h_hi}}, hi;
        cvt.rn.f16x2.e4m3x2 w0, l_lo;
        cvt.rn.f16x2.e4m3x2 w1, l_hi;
        cvt.rn.f16x2.e4m3x2 w2, h_lo;
        cvt.rn.f16x2.e4m3x2 w3, h_hi;
        """
)
FP4_WORD_REGISTERS = (
    "{ .reg .b32 ev, od, t0, t1, lo, hi, w0, w1, w2, w3;\n.reg .b16 l_lo, l_hi, h_lo, h_hi;\n"
)
# w0-w3 as the asm's eight 16-bit outputs $0-$7, and the end of the asm block
WORDS_TO_HALVES_OUT = """mov.b32 {$0, $1}, w0;
        mov.b32 {$2, $3}, w1;
        mov.b32 {$4, $5}, w2;
        mov.b32 {$6, $7}, w3; }"""
FP4_WORD_TO_HALVES_ASM = constexpr(
    FP4_WORD_REGISTERS + FP4_WORD_TO_F16X2_ASM.format(q="$8") + WORDS_TO_HALVES_OUT
)


@jit
def fp4_word_to_halves(q):
    """The eight E2M1 codes of each word, lowest nibble first, as f16 worth value * 2**-6 (the
    e4m3 trick)."""
    return tl.inline_asm_elementwise(
        asm=FP4_WORD_TO_HALVES_ASM,
        constraints="=h,=h,=h,=h,=h,=h,=h,=h,r",
        args=[q],
        dtype=(tl.float16,) * 8,
        is_pure=True,
        pack=1,
    )


@jit
def _fp4_pair_dots(q0, q1, x0, x1, x2, x3, x4, x5, x6, x7):
    """sum_j w_j * x_j over the 16 codes of words q0, q1 (K-adjacent words of one row) in one
    f16x2 chain, as its two lanes in fp32, in units of 2**-6 (the e4m3 trick) * 2**-4 (the x
    operands'). x0..x3 are q0's operands, x4..x7 q1's (``_x_word_pairs``)."""
    return tl.inline_asm_elementwise(
        asm=FP4_PAIR_DOTS_ASM,
        constraints="=f,=f,r,r,r,r,r,r,r,r,r,r",
        args=[q0, q1, x0, x1, x2, x3, x4, x5, x6, x7],
        dtype=(tl.float32, tl.float32),
        is_pure=True,
        pack=1,
    )


# FP8's x for one word pair: eight 16-bit activations -> four f16x2 operands (x0, x1), (x2, x3),
# (x4, x5), (x6, x7), each times the program's factor ($5, fp32 bits; ``_x_factor``) in fp32, then
# rounded to f16.
_X_BF16_QUAD = """shl.b32 lo, {a}, 16; and.b32 hi, {a}, 0xFFFF0000;
        mul.f32 lo, lo, $5; mul.f32 hi, hi, $5; cvt.rn.f16x2.f32 {out}, hi, lo;"""
_X_F16_QUAD = """mov.b32 {{h0, h1}}, {a}; cvt.f32.f16 lo, h0; cvt.f32.f16 hi, h1;
        mul.f32 lo, lo, $5; mul.f32 hi, hi, $5; cvt.rn.f16x2.f32 {out}, hi, lo;"""


def _x_quads_asm(bf16: bool) -> str:
    """PTX: x[8p .. 8p + 7] loaded from $4 as four 32-bit words, scaled by $5 -> $0..$3."""
    quad = _X_BF16_QUAD if bf16 else _X_F16_QUAD
    body = "\n".join(quad.format(a=f"a{i}", out=f"${i}") for i in range(4))
    return (
        "{ .reg .b32 a0, a1, a2, a3, lo, hi; .reg .b16 h0, h1;\n"
        "ld.global.nc.v4.u32 {a0, a1, a2, a3}, [$4];\n" + body + " }"
    )


X_BF16_QUADS_ASM = constexpr(_x_quads_asm(True))
X_F16_QUADS_ASM = constexpr(_x_quads_asm(False))
# Two K-adjacent words of e4m3 bytes times their x operands in one f16x2 chain: each lane sums
# four products of |w| <= 448 and |x'| < 16, so |sum| < 2**15, inside f16.
FP8_PAIR_DOTS_ASM = constexpr(
    """{ .reg .b16 b0, b1, b2, b3, a_lo, a_hi; .reg .b32 w0, w1, w2, w3, acc;
        mov.b32 {b0, b1}, $2;
        mov.b32 {b2, b3}, $3;
        cvt.rn.f16x2.e4m3x2 w0, b0;
        cvt.rn.f16x2.e4m3x2 w1, b1;
        cvt.rn.f16x2.e4m3x2 w2, b2;
        cvt.rn.f16x2.e4m3x2 w3, b3;
"""
    + _f16x2_chain(4, start=True)
    + _LANES_TO_F32
)


@jit
def _x_factor(x_ptr, row, stride_xm, M, w_start, w_end, X_CHUNK: tl.constexpr):
    """2**e such that max |x[row, 4 w_start : 4 w_end]| * 2**e is in [8, 16) (2**127 for a
    row of zeros): the factor FP8's f16 sums take x at, so that they neither overflow nor lose
    small activations to f16's subnormals."""
    r = tl.where(row < M, row, 0).to(tl.int64)
    peak = tl.zeros([X_CHUNK], dtype=tl.float32)
    for k0 in range(4 * w_start, 4 * w_end, X_CHUNK):
        k = k0 + tl.arange(0, X_CHUNK)
        v = tl.load(x_ptr + r * stride_xm + k, mask=k < 4 * w_end, other=0.0)
        peak = tl.maximum(peak, tl.abs(v.to(tl.float32)))
    biased_exp = (tl.max(peak, axis=0).to(tl.int32, bitcast=True) >> 23) & 0xFF
    # amax in [2**(b - 127), 2**(b - 126)) -> 2**(130 - b): exponent field 257 - b, kept finite
    return (tl.minimum(257 - biased_exp, 254) << 23).to(tl.float32, bitcast=True)


@jit
def _fp8_packed_part(
    x_ptr, row, stride_xm, M, w_first, words, q, factor, X_BF16: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    """sum over each word pair's 8 weights of w * x[row] * factor: [BLOCK_N, BLOCK_W // 2].
    Pairs past the end read the last pair's x (in bounds); their weights were loaded as 0."""
    q0, q1 = tl.split(tl.reshape(q, (BLOCK_N, BLOCK_W // 2, 2)))
    pair = tl.minimum(w_first // 2 + tl.arange(0, BLOCK_W // 2), words // 2 - 1)[None, :]
    r = tl.where(row < M, row, 0).to(tl.int64)
    factor_bits = factor.to(tl.int32, bitcast=True)
    x0, x1, x2, x3 = tl.inline_asm_elementwise(
        asm=X_BF16_QUADS_ASM if X_BF16 else X_F16_QUADS_ASM,
        constraints="=r,=r,=r,=r,l,r",
        # the factor's bits: inline asm broadcasts its arguments as binary operands, and a
        # pointer does not pair with a float
        args=[x_ptr + r * stride_xm + pair * 8, tl.zeros(pair.shape, tl.int32) + factor_bits],
        dtype=(tl.int32,) * 4,
        is_pure=True,
        pack=1,
    )
    lo, hi = tl.inline_asm_elementwise(
        asm=FP8_PAIR_DOTS_ASM,
        constraints="=f,=f,r,r,r,r,r,r",
        args=[q0, q1, x0, x1, x2, x3],
        dtype=(tl.float32, tl.float32),
        is_pure=True,
        pack=1,
    )
    return lo + hi


@jit
def _fp4_packed_part(
    x_ptr, row, stride_xm, M, w_first, words, q, X_BF16: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr,
):  # fmt: skip
    """sum over each word pair's 16 codes of w * x[row]: [BLOCK_N, BLOCK_W // 2]. Pairs past
    the end read the last pair's x (in bounds); their codes were loaded as 0."""
    q0, q1 = tl.split(tl.reshape(q, (BLOCK_N, BLOCK_W // 2, 2)))
    pair = tl.minimum(w_first // 2 + tl.arange(0, BLOCK_W // 2), words // 2 - 1)[None, :]
    x0, x1, x2, x3, x4, x5, x6, x7 = _x_word_pairs(x_ptr, row, stride_xm, M, pair, X_BF16)
    lo, hi = _fp4_pair_dots(q0, q1, x0, x1, x2, x3, x4, x5, x6, x7)
    return lo + hi


@jit
def _row_step(
    acc,
    x_ptr,
    row,
    stride_xm,
    M,
    w_first,
    words,
    mask,
    q,
    scale,
    x_factor,
    FP4: tl.constexpr,
    PACKED: tl.constexpr,
    X_BF16: tl.constexpr,
    USE_ASM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_W: tl.constexpr,
    WORDS_PER_GROUP: tl.constexpr,
    W16: tl.constexpr,
):
    """One K step of one row of x, words w_first .. w_first + BLOCK_W - 1 of W's rows, added
    into its accumulator."""
    k_first = (w_first + tl.arange(0, BLOCK_W)) * (8 if FP4 else (2 if W16 else 4))
    if W16:
        lo, hi = _halves_to_f32(q, X_BF16)
        acc += lo * _x_at(x_ptr, row, stride_xm, M, k_first, mask)
        acc += hi * _x_at(x_ptr, row, stride_xm, M, k_first + 1, mask)
    elif FP4:
        if PACKED:
            part = _fp4_packed_part(
                x_ptr, row, stride_xm, M, w_first, words, q, X_BF16, BLOCK_N, BLOCK_W
            )
        else:
            even, odd = _e4m3_bytes_of_fp4(q)
            e0, e1, e2, e3 = _e4m3x4_to_f32(even, USE_ASM)
            o0, o1, o2, o3 = _e4m3x4_to_f32(odd, USE_ASM)
            part = _fp4_row_part(
                x_ptr, row, stride_xm, M, k_first, mask, e0, e1, e2, e3, o0, o1, o2, o3
            )
        # a packed part has one sum per word pair, the other one per word
        per_group: tl.constexpr = WORDS_PER_GROUP // 2 if PACKED else WORDS_PER_GROUP
        groups = tl.reshape(part, (BLOCK_N, BLOCK_W // WORDS_PER_GROUP, per_group))
        acc += tl.sum(groups, axis=2) * scale
    elif PACKED:
        part = _fp8_packed_part(
            x_ptr, row, stride_xm, M, w_first, words, q, x_factor, X_BF16, BLOCK_N, BLOCK_W
        )
        acc += part * scale
    else:
        w0, w1, w2, w3 = _e4m3x4_to_f32(q, USE_ASM)
        # scale: 1.0, or each word's FP8 block scale (one FFMA in place of the add)
        acc += _fp8_row_part(x_ptr, row, stride_xm, M, k_first, mask, w0, w1, w2, w3) * scale
    return acc
