"""In-register pieces of the word GEMV (``word_gemv.py``): 32-bit words of FP4 codes or e4m3
bytes decoded to floats, x fetched in the matching order, and one K step of one row of x.
The decoding tricks and their exactness are described in ``word_gemv.py``'s docstring."""

from __future__ import annotations

from kvserve.kernels._triton import constexpr, jit, tl

# The units the partial sums come out in, as powers of two the block scale multiplies back:
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
def _block_scale(s, SCALE_E8M0: tl.constexpr, LOG2_UNIT: tl.constexpr):
    """Block scale bytes -> fp32 times 2**LOG2_UNIT (the units the partial sums are in)."""
    if SCALE_E8M0:  # 2**(e - 127 + LOG2_UNIT) as fp32 bits (exact for e <= 254 - LOG2_UNIT)
        return ((s.to(tl.int32) + LOG2_UNIT) << 23).to(tl.float32, bitcast=True)
    return s.to(tl.float8e4nv, bitcast=True).to(tl.float32) * (1 << LOG2_UNIT)


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


@jit
def _x_pair(x_ptr, row, stride_xm, M, k_lo, k_hi, mask):
    """x[row, k_lo] and x[row, k_hi], times 2**-4, as the halves of one f16x2 word [1, BLOCK_W]
    (2**-4: activations up to 2**20 stay inside f16 after the product sums)."""
    unit = 1.0 / (1 << X_PAIR_LOG2)
    lo = (_x_at(x_ptr, row, stride_xm, M, k_lo, mask) * unit).to(tl.float16)
    hi = (_x_at(x_ptr, row, stride_xm, M, k_hi, mask) * unit).to(tl.float16)
    return tl.inline_asm_elementwise(
        "mov.b32 $0, {$1, $2};", "=r,h,h", [lo, hi], dtype=tl.int32, is_pure=True, pack=1
    )


@jit
def _fp4_word_dots(q, x02, x46, x13, x57):
    """sum_j w_j * x_j over the 8 codes of each word, fp32 [BLOCK_N, BLOCK_W], in units of
    2**-6 (the e4m3 trick) * 2**-4 (the x pairs'): the codes widen to f16x2 pairs (even codes
    0/2 and 4/6, odd 1/3 and 5/7, as ``cvt.rn.f16x2.e4m3x2`` pairs a word's bytes), the products
    sum in f16x2 (one HFMA2 for two weights), and the two lanes in fp32."""
    return tl.inline_asm_elementwise(
        asm="""{ .reg .b32 ev, od, t0, t1, w0, w1, w2, w3, acc;
        .reg .b16 e_lo, e_hi, o_lo, o_hi, a_lo, a_hi; .reg .f32 f_lo, f_hi;
        and.b32 t0, $1, 0x07070707; shl.b32 t0, t0, 2;
        and.b32 t1, $1, 0x08080808; shl.b32 t1, t1, 4;
        or.b32 ev, t0, t1;
        shr.b32 t0, $1, 2; and.b32 t0, t0, 0x1C1C1C1C;
        and.b32 t1, $1, 0x80808080;
        or.b32 od, t0, t1;
        mov.b32 {e_lo, e_hi}, ev;
        mov.b32 {o_lo, o_hi}, od;
        cvt.rn.f16x2.e4m3x2 w0, e_lo;
        cvt.rn.f16x2.e4m3x2 w1, e_hi;
        cvt.rn.f16x2.e4m3x2 w2, o_lo;
        cvt.rn.f16x2.e4m3x2 w3, o_hi;
        mul.rn.f16x2 acc, w0, $2;
        fma.rn.f16x2 acc, w1, $3, acc;
        fma.rn.f16x2 acc, w2, $4, acc;
        fma.rn.f16x2 acc, w3, $5, acc;
        mov.b32 {a_lo, a_hi}, acc;
        cvt.f32.f16 f_lo, a_lo;
        cvt.f32.f16 f_hi, a_hi;
        add.f32 $0, f_lo, f_hi; }""",
        constraints="=f,r,r,r,r,r",
        args=[q, x02, x46, x13, x57],
        dtype=tl.float32,
        is_pure=True,
        pack=1,
    )


@jit
def _fp4_packed_part(
    x_ptr, row, stride_xm, M, k8, mask, q, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr
):
    shape: tl.constexpr = (BLOCK_N, BLOCK_W)
    x02 = tl.broadcast_to(_x_pair(x_ptr, row, stride_xm, M, k8, k8 + 2, mask), shape)
    x46 = tl.broadcast_to(_x_pair(x_ptr, row, stride_xm, M, k8 + 4, k8 + 6, mask), shape)
    x13 = tl.broadcast_to(_x_pair(x_ptr, row, stride_xm, M, k8 + 1, k8 + 3, mask), shape)
    x57 = tl.broadcast_to(_x_pair(x_ptr, row, stride_xm, M, k8 + 5, k8 + 7, mask), shape)
    return _fp4_word_dots(q, x02, x46, x13, x57)


@jit
def _row_step(
    acc,
    x_ptr,
    row,
    stride_xm,
    M,
    k_first,
    mask,
    q,
    scale,
    FP4: tl.constexpr,
    PACKED: tl.constexpr,
    USE_ASM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_W: tl.constexpr,
    WORDS_PER_GROUP: tl.constexpr,
):
    """One K step of one row of x added into its accumulator."""
    if FP4:
        if PACKED:
            part = _fp4_packed_part(x_ptr, row, stride_xm, M, k_first, mask, q, BLOCK_N, BLOCK_W)
        else:
            even, odd = _e4m3_bytes_of_fp4(q)
            e0, e1, e2, e3 = _e4m3x4_to_f32(even, USE_ASM)
            o0, o1, o2, o3 = _e4m3x4_to_f32(odd, USE_ASM)
            part = _fp4_row_part(
                x_ptr, row, stride_xm, M, k_first, mask, e0, e1, e2, e3, o0, o1, o2, o3
            )
        groups = tl.reshape(part, (BLOCK_N, BLOCK_W // WORDS_PER_GROUP, WORDS_PER_GROUP))
        acc += tl.sum(groups, axis=2) * scale
    else:
        w0, w1, w2, w3 = _e4m3x4_to_f32(q, USE_ASM)
        acc += _fp8_row_part(x_ptr, row, stride_xm, M, k_first, mask, w0, w1, w2, w3)
    return acc
