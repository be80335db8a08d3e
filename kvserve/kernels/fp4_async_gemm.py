"""Weight-only FP4 GEMM on Hopper with the MMA asynchronous: W decoded in registers straight into
wgmma's A-operand layout while the previous K step's wgmma runs (Gluon). For decode steps of
17-128 rows of bf16 x; the layout of W is the shipped one (``fp4_reference.py``).

Why: the Triton kernel (``fp4_gemm.py``) hands wgmma the decoded W from registers, and Triton
waits for each such wgmma before the next instruction, so a warp's decode and its MMAs take turns.
Here the wait for step i's wgmma comes after step i + 1's decode (``warpgroup_mma_wait(1)``).

Layout of a K step (128 columns). A thread of wgmma's A operand (bf16, ``k_width`` 2) holds, of
each row it owns, the column pairs ``16 kb + 8 h + 2 q + (0, 1)`` for kb < 8, h < 2, where q is
its lane in its quad. The thread loads instead the four words ``4 q .. 4 q + 3`` of the row (one
16-byte load): K index ``k = 32 q + 8 kbhi + 4 kblo + 2 h + e`` (word ``4 q + kbhi``, nibble
``4 kblo + 2 h + e``). It places that code at A column ``p = 32 kbhi + 16 kblo + 8 h + 2 q + e``,
a permutation of the step's K; x's columns arrive in the same permutation (``permute_x_steps``,
one copy of x a call), so the MMA's sum over K is unchanged. The decode, the scales and the
joins then never leave the thread: no shared-memory round trip for W.

x and the codes: each step's x tile [BLOCK_M, 128] (already permuted) is copied into shared
memory by the copy engine (TMA, which needs no proxy fence before wgmma reads it), and its codes
(cp.async, 16 bytes a thread) beside it, into rings of STAGES slots, STAGES - 2 steps ahead. The
slot a step fills was last read by the wgmma two steps back, finished in every warpgroup once all
have passed the step's barrier: one barrier a step. Scales are plain loads, two steps ahead.

The PTX must not redefine a wgmma's A registers before the wait that retires it (and the ptxas
Triton 3.6 bundles does not protect them itself: triton-lang/triton#9433), so the K loop runs
STAGES steps an iteration, each with registers of its own.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from kvserve.config import env_switch
from kvserve.kernels.fp4_reference import MXFP4_GROUP, group_size_of
from kvserve.kernels.fp4_tile import MAX_BLOCK_M, block_m_for, code_words
from kvserve.kernels.skinny_gemm import SplitLaunch
from kvserve.kernels.word_decode import (
    FP4_WORD_REGISTERS,
    FP4_WORD_TO_F16X2_ASM,
    WORDS_TO_HALVES_OUT,
)

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        async_copy,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    from triton.runtime.jit import constexpr_function

    HAS_GLUON = True
except ImportError:  # CPU-only install
    HAS_GLUON = False

STEP_K = 128  # K a step
STEP = gl.constexpr(STEP_K) if HAS_GLUON else STEP_K
ROWS_A_WARP = gl.constexpr(16) if HAS_GLUON else 16  # rows of W a warp owns in wgmma's A layout


def _jit(fn):  # noqa: ANN001, ANN202
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
# The bit placement's codes are worth value * 2**-126, 2**8 less than the e4m3 trick's: the
# products are worth value * 2**-8, and the sum is scaled back by 2**8 once, after the K loop
BITS_SUM_SCALE = gl.constexpr(256.0) if HAS_GLUON else 256.0
# 2**118 (the unit of the e4m3 trick's codes, above) folded into the scales: NVFP4's e4m3 scale
# times it stays below bf16's largest (448 * 2**118 < 2**127); MXFP4's E8M0 scale 2**(e - 127)
# times it is bf16 with exponent field e + 118, exact up to e = 136 (checked by the caller).
CODE_UNIT_LOG2 = 118
_CODE_UNIT = gl.constexpr(CODE_UNIT_LOG2) if HAS_GLUON else CODE_UNIT_LOG2
# x's ring: the 128-byte swizzle wgmma reads B with
_X_SMEM = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16) if HAS_GLUON else None


@_jit
def _decode_step(q, s, SCALE_E8M0: gl.constexpr, BITS: gl.constexpr, A_LAYOUT: gl.constexpr):
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
        f = ((s.to(gl.int32) + _CODE_UNIT) << 7).to(gl.int16).to(gl.bfloat16, bitcast=True)
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


@_jit
def _by_nibble(c0, c1, c2, c3, c4, c5, c6, c7):
    """Eight [BLOCK_N, 16] tensors, argument e + 2 h + 4 kblo, joined into
    [BLOCK_N, 16, e, h, kblo] (each thread's own registers)."""
    return gl.join(
        gl.join(gl.join(c0, c1), gl.join(c2, c3)), gl.join(gl.join(c4, c5), gl.join(c6, c7))
    )


@_jit
def _ring(SLOTS: gl.constexpr, dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
    """SLOTS (4-6) shared buffers, each its own allocation (``_k_step`` says why)."""
    if SLOTS == 4:
        ring = (_buffer(dtype, shape, layout), _buffer(dtype, shape, layout),
                _buffer(dtype, shape, layout), _buffer(dtype, shape, layout))  # fmt: skip
    elif SLOTS == 5:
        ring = (_buffer(dtype, shape, layout), _buffer(dtype, shape, layout),
                _buffer(dtype, shape, layout), _buffer(dtype, shape, layout),
                _buffer(dtype, shape, layout))  # fmt: skip
    else:
        ring = (_buffer(dtype, shape, layout), _buffer(dtype, shape, layout),
                _buffer(dtype, shape, layout), _buffer(dtype, shape, layout),
                _buffer(dtype, shape, layout), _buffer(dtype, shape, layout))  # fmt: skip
    return ring


@_jit
def _buffer(dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
    return gl.allocate_shared_memory(dtype, shape, layout)


@_jit
def _copy_x(x_desc, x_at, step, buf, ready, ok):
    """x's tile of K step ``step`` into ``buf`` by the copy engine (TMA), counted on ``ready``,
    whose phase expects its bytes already (``mbarrier.expect``, before the step's barrier: after
    it, Triton puts a second barrier between the expect and the copy). An async-proxy write,
    which wgmma (async proxy too) reads after waiting on ``ready`` with no proxy fence: the
    fence a thread's copy would need (MEMBAR.ALL.CTA on sm_90) waits for every load the thread
    has in flight, the scales' included."""
    row, col = x_at
    tma.async_copy_global_to_shared(x_desc, [row, col + step * STEP], ready, buf, pred=ok)


@_jit
def _k_step(
    i, SLOT: gl.constexpr, steps, acc, scales, code_bufs, x_bufs, x_ready, w_ptrs, x_desc,
    x_at, s_ptrs, GROUP: gl.constexpr, SCALE_E8M0: gl.constexpr, BITS: gl.constexpr,
    A_OP: gl.constexpr,
):  # fmt: skip
    """K step i, in ring slot SLOT = i % STAGES: its copies waited for, step i + STAGES - 2's
    issued, its W decoded, its wgmma issued and step i - 1's retired. ``scales``: the scale
    bytes of steps i and i + 1 (loaded two steps ahead, as plain loads); returns the
    accumulator and those of steps i + 1 and i + 2. ``x_at``: the split's first x tile (row,
    column). The slots are separate allocations picked statically: Triton's barrier analysis
    tells allocations apart, not slices of one, and would otherwise put a barrier between the
    step's reads of its slot and its copies into another."""
    STAGES: gl.constexpr = len(code_bufs)
    AHEAD: gl.constexpr = STAGES - 2
    fill: gl.constexpr = (SLOT + AHEAD) % STAGES
    ok = i + AHEAD < steps
    # every thread waited on x_ready[fill]'s last phase (step i - 2) before step i - 1's barrier
    mbarrier.expect(x_ready[fill], x_desc.block_type.nbytes, pred=ok)
    async_copy.wait_group(AHEAD - 1)
    gl.thread_barrier()
    s, s_next = scales
    q = code_bufs[SLOT].load(s.type.layout)
    async_copy.async_copy_global_to_shared(code_bufs[fill], w_ptrs + (i + AHEAD) * 16, mask=ok)
    async_copy.commit_group()
    _copy_x(x_desc, x_at, i + AHEAD, x_bufs[fill], x_ready[fill], ok)
    s_ahead = gl.load(s_ptrs + (i + 2) * (STEP // GROUP), mask=i + 2 < steps, other=0)
    w = _decode_step(q, s, SCALE_E8M0, BITS, A_OP)
    mbarrier.wait(x_ready[SLOT], (i // STAGES) & 1)
    acc = warpgroup_mma(w, x_bufs[SLOT].permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma_wait(1, deps=(acc,))
    return acc, (s_next, s_ahead)


@_jit
def _fp4_async_kernel(
    x_desc, w_ptr, s_ptr, rs_ptr, bias_ptr, out_ptr, ws_ptr, counter_ptr,
    M, N, K, stride_wn, stride_sn, stride_om, k_per_split,
    BLOCK_M: gl.constexpr, GROUP: gl.constexpr, SCALE_E8M0: gl.constexpr,
    HAS_ROW_SCALE: gl.constexpr, HAS_BIAS: gl.constexpr, DIRECT: gl.constexpr,
    STAGES: gl.constexpr, BITS: gl.constexpr,
):  # fmt: skip
    """out [M, N] = x @ W.T; grid (M tiles, N tiles, splits of K), the splits summed as in the
    skinny GEMM (``_split_total``; unused ws_ptr / counter_ptr when DIRECT). x_desc: a TMA
    descriptor of x [M, K] bf16, each step's columns permuted (``permute_x_steps``), tiles
    [BLOCK_M, 128] (rows past M read as zeros). The codes (cp.async) and x's steps (TMA) go
    into rings of STAGES buffers, AHEAD = STAGES - 2 steps ahead: the slot a step fills was
    last read by the wgmma two steps back, finished in every warpgroup once all have passed
    the last barrier."""
    WARPS: gl.constexpr = gl.num_warps()
    BLOCK_N: gl.constexpr = ROWS_A_WARP * WARPS
    AHEAD: gl.constexpr = STAGES - 2
    CODES: gl.constexpr = codes_layout(WARPS)
    ACC: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BLOCK_M, 16]
    )
    A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC, k_width=2)
    CODE_COPY: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [WARPS, 1], [1, 0])
    PLAIN: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    X_SMEM: gl.constexpr = x_desc.layout
    BARRIER: gl.constexpr = mbarrier.MBarrierLayout()

    pid_m = gl.program_id(0)
    pid_n = gl.program_id(1)
    k_start = gl.multiple_of(gl.program_id(2) * k_per_split, STEP)
    steps = gl.cdiv(gl.minimum(k_start + k_per_split, K) - k_start, STEP)

    rn = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, CODES))
    words = gl.arange(0, 16, layout=gl.SliceLayout(0, CODES))
    s_ptrs = s_ptr + (rn % N).to(gl.int64)[:, None] * stride_sn
    s_ptrs = s_ptrs + (k_start // GROUP + words // (GROUP // 8))[None, :]
    rn_c = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, CODE_COPY))
    words_c = gl.arange(0, 16, layout=gl.SliceLayout(0, CODE_COPY))
    w_ptrs = (
        w_ptr + (rn_c % N).to(gl.int64)[:, None] * stride_wn + (k_start // 8 + words_c)[None, :]
    )
    x_at = (pid_m * BLOCK_M, k_start)

    code_bufs = _ring(STAGES, gl.int32, [BLOCK_N, 16], PLAIN)
    x_bufs = _ring(STAGES, gl.bfloat16, [BLOCK_M, STEP], X_SMEM)
    x_ready = _ring(STAGES, gl.int64, [1], BARRIER)
    for j in gl.static_range(STAGES):
        mbarrier.init(x_ready[j], count=1)
    for j in gl.static_range(AHEAD):
        mbarrier.expect(x_ready[j], x_desc.block_type.nbytes, pred=j < steps)
    gl.thread_barrier()
    for j in gl.static_range(AHEAD):
        ok = j < steps
        async_copy.async_copy_global_to_shared(code_bufs[j], w_ptrs + j * 16, mask=ok)
        async_copy.commit_group()
        _copy_x(x_desc, x_at, j, x_bufs[j], x_ready[j], ok)
    scales = (gl.load(s_ptrs), gl.load(s_ptrs + STEP // GROUP, mask=steps > 1, other=0))
    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, ACC)
    # STAGES steps an iteration: each reads and fills static slots, and decodes W into registers
    # of its own (the module docstring says why)
    full = steps - steps % STAGES
    for i in range(0, full, STAGES):
        for c in gl.static_range(STAGES):
            acc, scales = _k_step(
                i + c, c, steps, acc, scales, code_bufs, x_bufs, x_ready, w_ptrs, x_desc, x_at,
                s_ptrs, GROUP, SCALE_E8M0, BITS, A_OP,
            )  # fmt: skip
    for c in gl.static_range(STAGES - 1):
        if full + c < steps:
            acc, scales = _k_step(
                full + c, c, steps, acc, scales, code_bufs, x_bufs, x_ready, w_ptrs, x_desc,
                x_at, s_ptrs, GROUP, SCALE_E8M0, BITS, A_OP,
            )  # fmt: skip
    acc = warpgroup_mma_wait(0, deps=(acc,))
    async_copy.wait_group(0)
    for j in gl.static_range(STAGES):
        mbarrier.invalidate(x_ready[j])

    rn = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ACC))
    rm = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, ACC))
    if not DIRECT:
        tile = pid_n * gl.num_programs(0) + pid_m
        acc, last = _split_total(
            acc, tile, gl.program_id(2), gl.num_programs(2), ws_ptr, counter_ptr
        )
    if DIRECT or last:
        if BITS:
            acc = acc * BITS_SUM_SCALE
        if HAS_ROW_SCALE:
            acc = acc * gl.load(rs_ptr + rn, mask=rn < N, other=0.0)[:, None]
        if HAS_BIAS:
            acc = acc + gl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(gl.float32)[:, None]
        out_ptrs = out_ptr + rm[None, :].to(gl.int64) * stride_om + rn[:, None]
        gl.store(
            out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(rm < M)[None, :] & (rn < N)[:, None]
        )


@_jit
def _split_total(acc, tile, pid_k, num_splits, ws_ptr, counter_ptr):
    """This split's partial of ``tile`` stored; the split arriving last gets (the partials
    summed in split order, True) and puts the tile's counter back to 0 for the next launch, the
    others (acc, False). The skinny GEMM's reduction (``skinny_gemm.split_total``)."""
    BLOCK_N: gl.constexpr = acc.shape[0]
    BLOCK_M: gl.constexpr = acc.shape[1]
    LAYOUT: gl.constexpr = acc.type.layout
    rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LAYOUT))
    cols = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, LAYOUT))
    offs = rows[:, None] * BLOCK_M + cols[None, :]
    tile_ws = ws_ptr + tile.to(gl.int64) * num_splits * (BLOCK_N * BLOCK_M)
    gl.store(tile_ws + pid_k * (BLOCK_N * BLOCK_M) + offs, acc)
    gl.thread_barrier()  # every thread's stores precede the release below
    last = gl.atomic_add(counter_ptr + tile, 1, sem="acq_rel", scope="gpu") == num_splits - 1
    if last:
        acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, LAYOUT)
        for split in range(num_splits):
            # .cg: from L2, where the other SMs' stores are
            acc += gl.load(tile_ws + split * (BLOCK_N * BLOCK_M) + offs, cache_modifier=".cg")
        gl.store(counter_ptr + tile, 0)
    return acc, last


ASYNC_ENV = "KVSERVE_FP4_ASYNC"
# Rows of x the default hands this kernel (with ``KVSERVE_FP4_ASYNC=1``): past the 16 rows where
# the Triton kernel's mma.sync (W as B) is its best case, up to one 128-row x tile.
ASYNC_MIN_ROWS, ASYNC_MAX_ROWS = 17, MAX_BLOCK_M
# The largest MXFP4 scale exponent the kernel takes (``CODE_UNIT_LOG2``)
MAX_E8M0 = 254 - CODE_UNIT_LOG2
_MIN_STEPS_PER_SPLIT = 4
# A thread's registers for two 8-warp programs an SM (2 x 256 x 128 = the SM's 64K): ptxas fits
# the K loop of x tiles up to 64 rows in them without spills (190 uncapped: one program an SM,
# two warps a scheduler, the step latency-bound; s74 Nsight Compute); 128-row tiles would spill
TWO_PROGRAMS_REGISTERS = 128


BITS_ENV = "KVSERVE_FP4_ASYNC_BITS"
TWO_PROGRAMS_ENV = "KVSERVE_FP4_ASYNC_TWO_PROGRAMS"


@dataclass(frozen=True)
class AsyncGemmConfig:
    split_k: int = 1
    num_warps: int = 8  # 16 rows of W a warp: the W tile is 16 * num_warps rows
    stages: int = 4  # ring slots: copies run stages - 2 steps ahead
    bits: bool = False  # the bit-placing W decode
    max_registers: int | None = None  # TWO_PROGRAMS_REGISTERS: two programs an SM


@functools.cache
def async_bits_enabled() -> bool:
    """``KVSERVE_FP4_ASYNC_BITS``: 1 decodes W by placing its codes' bits into bf16
    (``_FP4_WORD_TO_BF16_BITS``); 0 (the default) by the e4m3 trick."""
    return env_switch(BITS_ENV, default=False)


@functools.cache
def async_two_programs_enabled() -> bool:
    """``KVSERVE_FP4_ASYNC_TWO_PROGRAMS``: 1 caps a thread at ``TWO_PROGRAMS_REGISTERS`` for x
    tiles up to 64 rows, so two programs share an SM; 0 (the default) leaves ptxas uncapped."""
    return env_switch(TWO_PROGRAMS_ENV, default=False)


@functools.cache
def async_gemm_enabled() -> bool:
    """``KVSERVE_FP4_ASYNC``: 1 runs FP4 steps of 17-128 rows on this kernel (Hopper, bf16
    activations); 0 (the default) on the Triton kernel (``fp4_gemm.py``)."""
    return env_switch(ASYNC_ENV, default=False)


@functools.cache
def _on_hopper(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9


def async_gemm_takes(x: torch.Tensor, rows: int) -> bool:
    """Whether this kernel takes a step of a weight that ``weight_fits``: a Hopper GPU with
    Gluon, bf16 x of ``rows`` rows in the kernel's range."""
    return (
        HAS_GLUON
        and ASYNC_MIN_ROWS <= rows <= ASYNC_MAX_ROWS
        and x.dtype == torch.bfloat16
        and _on_hopper(x.device)
    )


def weight_fits(packed: torch.Tensor, block_scale: torch.Tensor) -> bool:
    """An FP4 weight this kernel can take: K a multiple of 128, its rows word-aligned, and its
    block scales in range (NVFP4's always, MXFP4's up to 2**9). A host sync: call once per
    weight, at load."""
    k = packed.shape[-1] * 2
    if k % STEP_K or code_words(packed).dtype != torch.int32:
        return False
    if group_size_of(block_scale) != MXFP4_GROUP:
        return True
    return block_scale.numel() == 0 or int(block_scale.max()) <= MAX_E8M0


def async_config(
    m: int, n: int, k: int, *, num_sms: int = 132, bits: bool = False, two_programs: bool = False
) -> AsyncGemmConfig:
    """One program an SM (the kernel's registers allow no more), or two with ``two_programs``
    and x tiles up to 64 rows: K split until the programs fill 70% of those places, each split
    keeping four or more K steps (the loop's unrolled iteration). The best splits at one program
    an SM on an H100 (s74, 32 and 64 rows of Llama-3-8B): qkv's 48 tiles 2 (96 programs; 4 was
    20% slower), o's and down's 32 tiles 4, gate_up's 224 tiles 1."""
    block_m = block_m_for(m)
    two = two_programs and block_m <= MAX_BLOCK_M // 2
    tiles = -(-m // block_m) * -(-n // (16 * AsyncGemmConfig.num_warps))
    steps = k // STEP_K
    split = 1
    places = num_sms * (2 if two else 1)
    while tiles * split < 0.7 * places and steps // (2 * split) >= _MIN_STEPS_PER_SPLIT:
        split *= 2
    return AsyncGemmConfig(
        split_k=split, bits=bits, max_registers=TWO_PROGRAMS_REGISTERS if two else None
    )


def permute_x_steps(x: torch.Tensor, bits: bool = False) -> torch.Tensor:
    """x [M, K] with each 128-column step's columns in the kernel's permutation (the module
    docstring): natural column k = 32 q + 8 kbhi + 4 kblo + 2 h + e goes to column
    p = 32 kbhi + 16 kblo + 8 h + 2 q + e; with ``bits`` (the bit-placing decode, which pairs
    a word's codes j and j + 4), k = 32 q + 8 kbhi + 4 e + 2 kblo + h. A new contiguous tensor
    (one copy)."""
    m, k = x.shape
    if bits:
        steps = x.reshape(m, k // STEP_K, 4, 4, 2, 2, 2)  # [m, step, q, kbhi, e, kblo, h]
        return steps.permute(0, 1, 3, 5, 6, 2, 4).reshape(m, k)
    steps = x.reshape(m, k // STEP_K, 4, 4, 2, 2, 2)  # [m, step, q, kbhi, kblo, h, e]
    return steps.permute(0, 1, 3, 4, 5, 2, 6).reshape(m, k)


def fp4_async_linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    block_scale: torch.Tensor,
    row_scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    *,
    split_k: int = 1,
    num_warps: int = 8,
    stages: int = 4,
    bits: bool = False,
    max_registers: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x`` [M, K] bf16 @ W.T (+ bias) -> [M, N] bf16; W in the layout of ``fp4_reference``,
    K a multiple of 128 and word-aligned rows; MXFP4 block scales up to 2**9 (E8M0 exponent
    136, ``CODE_UNIT_LOG2``): the caller checks the weight once (``weight_fits``), as its scales
    take a host sync. ``bits``: codes decoded by placing their bits (``_FP4_WORD_TO_BF16_BITS``)
    instead of the e4m3 trick. ``max_registers``: ptxas's cap a thread (``maxnreg``); at 128
    two 8-warp programs share an SM (``TWO_PROGRAMS_REGISTERS``)."""
    group = group_size_of(block_scale)
    m, k = x.shape
    n = packed.shape[0]
    if x.dtype != torch.bfloat16 or k % STEP_K or packed.shape[1] * 2 != k:
        raise ValueError(f"fp4_async_linear: bf16 x and K % {STEP_K} == 0, got {x.dtype} {k}")
    words = code_words(packed)
    if words.dtype != torch.int32:
        raise ValueError("fp4_async_linear: W's rows must be word-aligned")
    x = permute_x_steps(x, bits)
    block_m = block_m_for(m)
    x_desc = TensorDescriptor.from_tensor(x, [block_m, STEP_K], _X_SMEM)
    if out is None:
        out = torch.empty(m, n, dtype=torch.bfloat16, device=x.device)
    plan = SplitLaunch.plan(m, n, k, block_m, 16 * num_warps, STEP_K, split_k, out)
    _fp4_async_kernel[plan.grid](
        x_desc, words, block_scale.view(torch.uint8),
        row_scale if row_scale is not None else out, bias if bias is not None else out, out,
        plan.workspace, plan.counters,
        m, n, k, words.stride(0), block_scale.stride(0), out.stride(0),
        plan.k_per_split, BLOCK_M=block_m, GROUP=group,
        SCALE_E8M0=block_scale.dtype == torch.uint8, HAS_ROW_SCALE=row_scale is not None,
        HAS_BIAS=bias is not None, DIRECT=plan.direct,
        STAGES=stages, BITS=bits, num_warps=num_warps,
        **({"maxnreg": max_registers} if max_registers else {}),
    )  # fmt: skip
    return out
