"""Weight-only FP4 GEMM on Hopper with the MMA asynchronous: W decoded in registers straight into
wgmma's A-operand layout while the previous K step's wgmma runs (Gluon). For decode steps of
17-128 rows of bf16 x; the layout of W is the shipped one (``fp4_reference.py``).

Why: the Triton kernel (``fp4_gemm.py``) hands wgmma the decoded W from registers, and Triton
waits for each such wgmma before the next instruction, so a warp's decode and its MMAs take turns.
Here the wait for step i's wgmma comes after step i + 1's decode (``warpgroup_mma_wait(1)``).

The layout of W and x within a K step, and the decodes: ``fp4_async_decode.py``; when kvserve
takes this kernel and how it splits K: ``fp4_async_choice.py``.

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

import torch

from kvserve.kernels._triton import launch_options, pdl_release, pdl_wait
from kvserve.kernels.fp4_async_decode import (
    BITS_SUM_SCALE,
    HAS_GLUON,
    ROWS_A_WARP,
    STEP,
    STEP_K,
    codes_layout,
    decode_step,
    jit,
)
from kvserve.kernels.fp4_reference import group_size_of
from kvserve.kernels.fp4_step_order import permute_x_steps
from kvserve.kernels.fp4_tile import block_m_for, code_words
from kvserve.kernels.fp4_x_permute import permute_x_steps_triton
from kvserve.kernels.skinny_gemm import SplitLaunch

if HAS_GLUON:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        async_copy,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

# sm_90's shared memory a block can opt into (227 KiB); the ring takes all but the barriers
SHARED_MEMORY_BYTES = 232448
_BARRIER_BYTES = 1024

# x's ring: the 128-byte swizzle wgmma reads B with
_X_SMEM = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16) if HAS_GLUON else None


def ring_bytes(block_m: int, num_warps: int, stages: int) -> int:
    """Shared memory of the ring: each slot holds x's [block_m, 128] bf16 tile and the
    [16 * num_warps, 64] bytes of W's codes for one K step."""
    return stages * (block_m * STEP_K * 2 + 16 * num_warps * STEP_K // 2)


def ring_fits(block_m: int, num_warps: int, stages: int) -> bool:
    """4-6 slots (``_ring``'s) within the shared memory a block may take."""
    need = ring_bytes(block_m, num_warps, stages) + _BARRIER_BYTES
    return 4 <= stages <= 6 and need <= SHARED_MEMORY_BYTES


def check_ring_fits(block_m: int, num_warps: int, stages: int) -> None:
    if not ring_fits(block_m, num_warps, stages):
        need = ring_bytes(block_m, num_warps, stages) + _BARRIER_BYTES
        raise ValueError(
            f"fp4_async_linear: {stages} ring slots of a {block_m}-row x tile and "
            f"{num_warps} warps need {need} bytes of shared memory; 4-6 slots within "
            f"{SHARED_MEMORY_BYTES} bytes fit"
        )


@jit
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


@jit
def _buffer(dtype: gl.constexpr, shape: gl.constexpr, layout: gl.constexpr):
    return gl.allocate_shared_memory(dtype, shape, layout)


@jit
def _copy_x(x_desc, x_at, step, buf, ready, ok):
    """x's tile of K step ``step`` into ``buf`` by the copy engine (TMA), counted on ``ready``,
    whose phase expects its bytes already (``mbarrier.expect``, before the step's barrier: after
    it, Triton puts a second barrier between the expect and the copy). An async-proxy write,
    which wgmma (async proxy too) reads after waiting on ``ready`` with no proxy fence: the
    fence a thread's copy would need (MEMBAR.ALL.CTA on sm_90) waits for every load the thread
    has in flight, the scales' included."""
    row, col = x_at
    tma.async_copy_global_to_shared(x_desc, [row, col + step * STEP], ready, buf, pred=ok)


@jit
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
    w = decode_step(q, s, SCALE_E8M0, BITS, A_OP)
    mbarrier.wait(x_ready[SLOT], (i // STAGES) & 1)
    acc = warpgroup_mma(w, x_bufs[SLOT].permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma_wait(1, deps=(acc,))
    return acc, (s_next, s_ahead)


@jit
def _fp4_async_kernel(
    x_desc, w_ptr, s_ptr, rs_ptr, bias_ptr, out_ptr, ws_ptr, counter_ptr,
    M, N, K, stride_wn, stride_sn, stride_om, k_per_split,
    BLOCK_M: gl.constexpr, GROUP: gl.constexpr, SCALE_E8M0: gl.constexpr,
    HAS_ROW_SCALE: gl.constexpr, HAS_BIAS: gl.constexpr, DIRECT: gl.constexpr,
    STAGES: gl.constexpr, BITS: gl.constexpr, USE_PDL: gl.constexpr,
):  # fmt: skip
    """out [M, N] = x @ W.T; grid (M tiles, N tiles, splits of K), the splits summed as in the
    skinny GEMM (``_split_total``; unused ws_ptr / counter_ptr when DIRECT). x_desc: a TMA
    descriptor of x [M, K] bf16, each step's columns permuted (``permute_x_steps``), tiles
    [BLOCK_M, 128] (rows past M read as zeros). The codes (cp.async) and x's steps (TMA) go
    into rings of STAGES buffers, AHEAD = STAGES - 2 steps ahead: the slot a step fills was
    last read by the wgmma two steps back, finished in every warpgroup once all have passed
    the last barrier. With USE_PDL the first steps' codes and scales (weights: no kernel of a
    step writes them) are asked for before the dependent-launch wait, x's tiles after it."""
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
    # each step's codes are one commit group: _k_step's wait_group counts on it
    for j in gl.static_range(AHEAD):
        async_copy.async_copy_global_to_shared(code_bufs[j], w_ptrs + j * 16, mask=j < steps)
        async_copy.commit_group()
    scales = (gl.load(s_ptrs), gl.load(s_ptrs + STEP // GROUP, mask=steps > 1, other=0))
    pdl_wait(USE_PDL)
    for j in gl.static_range(AHEAD):
        _copy_x(x_desc, x_at, j, x_bufs[j], x_ready[j], j < steps)
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
    pdl_release(USE_PDL)
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
        if BITS and not SCALE_E8M0:  # the products were worth 2**-8 of W x (NVFP4 only)
            acc = acc * BITS_SUM_SCALE
        if HAS_ROW_SCALE:
            acc = acc * gl.load(rs_ptr + rn, mask=rn < N, other=0.0)[:, None]
        if HAS_BIAS:
            acc = acc + gl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(gl.float32)[:, None]
        out_ptrs = out_ptr + rm[None, :].to(gl.int64) * stride_om + rn[:, None]
        gl.store(
            out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(rm < M)[None, :] & (rn < N)[:, None]
        )


@jit
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
    triton_permute: bool = True,
    x_permuted: bool = False,
    out: torch.Tensor | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """``x`` [M, K] bf16 @ W.T (+ bias) -> [M, N] bf16; W in the layout of ``fp4_reference``,
    K a multiple of 128 and word-aligned rows; MXFP4 block scales up to ``max_e8m0(bits)`` (2**9,
    or 2**1 with ``bits``): the caller checks the weight once (``weight_fits``), as its scales
    take a host sync. ``bits``: codes decoded by placing their bits (``_FP4_WORD_TO_BF16_BITS``)
    instead of the e4m3 trick. ``max_registers``: ptxas's cap a thread (``maxnreg``); at 128
    two 8-warp programs share an SM (``TWO_PROGRAMS_REGISTERS``). ``triton_permute``: x
    permuted by one Triton kernel (``fp4_x_permute``), not torch's strided copy (the reference,
    1-2 us slower a GEMM at 32-128 rows of Llama-3-8B on an H100, s76). ``x_permuted``: x's
    producer wrote it in that order already (``fp4_step_order``), so no permutation runs.
    ``pdl``: programmatic dependent launch of the GEMM and of the Triton permutation (torch's
    copy launches as it always does; ``kvserve.kernels._triton``)."""
    group = group_size_of(block_scale)
    m, k = x.shape
    n = packed.shape[0]
    if x.dtype != torch.bfloat16 or k % STEP_K or packed.shape[1] * 2 != k:
        raise ValueError(f"fp4_async_linear: bf16 x and K % {STEP_K} == 0, got {x.dtype} {k}")
    words = code_words(packed)
    if words.dtype != torch.int32:
        raise ValueError("fp4_async_linear: W's rows must be word-aligned")
    block_m = block_m_for(m)
    check_ring_fits(block_m, num_warps, stages)
    if not x_permuted:
        x = permute_x_steps_triton(x, bits, pdl) if triton_permute else permute_x_steps(x, bits)
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
        STAGES=stages, BITS=bits, num_warps=num_warps, **launch_options(pdl),
        **({"maxnreg": max_registers} if max_registers else {}),
    )  # fmt: skip
    return out
