"""FP4 weight-only GEMV for 1-4 rows of x: CUDA cores instead of tensor cores.

Reference: ``fp4_linear_reference`` in ``fp4_reference.py``; entry point ``fp4_linear`` in
``fp4_gemm.py`` (this file holds the kernel and its launch).

The MMA kernel (``fp4_gemm.py``) must hand each dequantized weight tile to the tensor cores in
their operand layout; with one to four rows of x there is nothing for them to do, and the
conversion and interleaving cost more than the math. Here a program owns BLOCK_N rows of W and
walks K in steps of GROUPS scale groups, viewing its packed bytes as [BLOCK_N, GROUPS, GROUP/2]:
the low nibbles (even k) and high nibbles (odd k) stay apart and meet x's even and odd columns,
so no tensor is interleaved or reshaped; the block scale multiplies one partial sum per group
(once per GROUP values, not per value). Per row of x, an fp32 accumulator [BLOCK_N, GROUPS] is
summed over groups at the end. Split K and the epilogue (row scale, bias, transposed store)
are the MMA kernel's.
"""

from __future__ import annotations

import torch

from kvserve.kernels._triton import jit, tl
from kvserve.kernels.fp4_tiles import GEMV_ROWS, Fp4GemvConfig, _epilogue
from kvserve.kernels.skinny_gemm import _arrival_counters, _jit, _sum_splits


@jit
def _codes_to_float(p):
    """Packed bytes -> (low-nibble values, high-nibble values) in fp32, times 2**-6 (see
    ``fp4_gemm._dequant_tile`` for the e4m3 trick)."""
    lo = ((p & 0x07) << 2) | ((p & 0x08) << 4)
    hi = ((p >> 2) & 0x1C) | (p & 0x80)
    lo = lo.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    hi = hi.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    return lo, hi


@jit
def _row_partial(x_ptr, row, stride_xm, x_even, x_lo_mask, w_lo, w_hi, scale, M):
    """sum over each group of w * x[row] (even and odd k), times the group's scale:
    [BLOCK_N, GROUPS]. Rows past M read row 0 (their results are never stored)."""
    r = tl.where(row < M, row, 0).to(tl.int64)
    xe = tl.load(x_ptr + r * stride_xm + x_even, mask=x_lo_mask, other=0.0).to(tl.float32)
    xo = tl.load(x_ptr + r * stride_xm + x_even + 1, mask=x_lo_mask, other=0.0).to(tl.float32)
    part = tl.sum(w_lo * xe[None, :, :] + w_hi * xo[None, :, :], axis=2)
    return part * scale


@_jit
def _fp4_gemv_kernel(
    x_ptr,
    w_ptr,  # uint8 [N, K/2]
    s_ptr,  # uint8 [N, K/GROUP]: E8M0 exponents or the bytes of e4m3 scales
    rs_ptr,
    bias_ptr,
    out_ptr,
    ws_ptr,  # fp32 [tiles, num_splits, BLOCK_N, 16]; unused when DIRECT
    counter_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_om,
    k_per_split,  # a multiple of GROUPS * GROUP
    num_splits,
    BLOCK_N: tl.constexpr,
    GROUPS: tl.constexpr,
    GROUP: tl.constexpr,
    ROWS: tl.constexpr,  # 1, 2 or 4 accumulators, >= M
    SCALE_E8M0: tl.constexpr,
    HAS_ROW_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    DIRECT: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rg = tl.arange(0, GROUPS)
    rb = tl.arange(0, GROUP // 2)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    rows_w = (rn % N).to(tl.int64)
    byte_offs = rg[None, :, None] * (GROUP // 2) + rb[None, None, :]  # [1, GROUPS, GROUP/2]
    w_ptrs = w_ptr + rows_w[:, None, None] * stride_wn + k_start // 2 + byte_offs
    s_ptrs = s_ptr + rows_w[:, None] * stride_sn + k_start // GROUP + rg[None, :]
    x_even = k_start + rg[:, None] * GROUP + 2 * rb[None, :]  # [GROUPS, GROUP/2]
    acc0 = tl.zeros([BLOCK_N, GROUPS], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_N, GROUPS], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_N, GROUPS], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_N, GROUPS], dtype=tl.float32)
    for k0 in range(k_start, k_end, GROUPS * GROUP):
        group_ok = (k0 // GROUP + rg) < K // GROUP  # [GROUPS]
        p = tl.load(w_ptrs, mask=group_ok[None, :, None], other=0)
        s = tl.load(s_ptrs, mask=group_ok[None, :], other=0)
        if SCALE_E8M0:
            scale = ((s.to(tl.int32) + 6) << 23).to(tl.float32, bitcast=True)
        else:
            scale = s.to(tl.float8e4nv, bitcast=True).to(tl.float32) * 64.0
        w_lo, w_hi = _codes_to_float(p)
        x_mask = group_ok[:, None]
        acc0 += _row_partial(x_ptr, 0, stride_xm, x_even, x_mask, w_lo, w_hi, scale, M)
        if ROWS > 1:
            acc1 += _row_partial(x_ptr, 1, stride_xm, x_even, x_mask, w_lo, w_hi, scale, M)
        if ROWS > 2:
            acc2 += _row_partial(x_ptr, 2, stride_xm, x_even, x_mask, w_lo, w_hi, scale, M)
            acc3 += _row_partial(x_ptr, 3, stride_xm, x_even, x_mask, w_lo, w_hi, scale, M)
        w_ptrs += GROUPS * GROUP // 2
        s_ptrs += GROUPS
        x_even += GROUPS * GROUP

    # One [BLOCK_N, 16] tile, column m = row m of x, as the MMA kernel's epilogue takes it.
    cols = tl.arange(0, 16)[None, :]
    tile = tl.where(cols == 0, tl.sum(acc0, axis=1)[:, None], 0.0)
    tile += tl.where(cols == 1, tl.sum(acc1, axis=1)[:, None], 0.0)
    tile += tl.where(cols == 2, tl.sum(acc2, axis=1)[:, None], 0.0)
    tile += tl.where(cols == 3, tl.sum(acc3, axis=1)[:, None], 0.0)
    _finish(
        tile, rs_ptr, bias_ptr, out_ptr, ws_ptr, counter_ptr, rn, M, N, stride_om, pid_n, pid_k,
        num_splits, BLOCK_N, HAS_ROW_SCALE, HAS_BIAS, DIRECT,
    )  # fmt: skip


@jit
def _finish(
    tile,
    rs_ptr,
    bias_ptr,
    out_ptr,
    ws_ptr,
    counter_ptr,
    rn,
    M,
    N,
    stride_om,
    pid_n,
    pid_k,
    num_splits,
    BLOCK_N: tl.constexpr,
    HAS_ROW_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    DIRECT: tl.constexpr,
):
    rm = tl.arange(0, 16)
    if DIRECT:
        _epilogue(tile, rs_ptr, bias_ptr, out_ptr, rn, rm, M, N, stride_om, HAS_ROW_SCALE, HAS_BIAS)
    else:
        tile_ws = ws_ptr + pid_n.to(tl.int64) * num_splits * BLOCK_N * 16
        offs = tl.arange(0, BLOCK_N)[:, None] * 16 + rm[None, :]
        tl.store(tile_ws + pid_k * BLOCK_N * 16 + offs, tile)
        tl.debug_barrier()
        arrived = tl.atomic_add(counter_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == num_splits - 1:
            total = _sum_splits(tile_ws, num_splits, BLOCK_N, 16)
            _epilogue(
                total, rs_ptr, bias_ptr, out_ptr, rn, rm, M, N, stride_om, HAS_ROW_SCALE, HAS_BIAS
            )
            tl.store(counter_ptr + pid_n, 0)


def launch_fp4_gemv(
    x: torch.Tensor,
    packed: torch.Tensor,
    block_scale: torch.Tensor,
    row_scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    cfg: Fp4GemvConfig,
    group: int,
) -> None:
    m, k = x.shape
    n = packed.shape[0]
    if m > GEMV_ROWS:
        raise ValueError(f"the FP4 GEMV takes at most {GEMV_ROWS} rows, got {m}")
    step = cfg.groups * group
    n_tiles, k_steps = -(-n // cfg.block_n), -(-k // step)
    steps_per_split = -(-k_steps // max(1, min(cfg.split_k, k_steps)))
    splits = -(-k_steps // steps_per_split)
    direct = splits == 1
    ws = counters = out
    if not direct:
        ws = torch.empty(n_tiles * splits * cfg.block_n * 16, dtype=torch.float32, device=x.device)
        counters = _arrival_counters(x.device, n_tiles)
    _fp4_gemv_kernel[(n_tiles, splits)](
        x, packed, block_scale.view(torch.uint8),
        row_scale if row_scale is not None else out, bias if bias is not None else out,
        out, ws, counters, m, n, k, x.stride(0), packed.stride(0), block_scale.stride(0),
        out.stride(0), steps_per_split * step, splits,
        BLOCK_N=cfg.block_n, GROUPS=cfg.groups, GROUP=group, ROWS=min(4, 1 << (m - 1).bit_length()),
        SCALE_E8M0=block_scale.dtype == torch.uint8, HAS_ROW_SCALE=row_scale is not None,
        HAS_BIAS=bias is not None, DIRECT=direct,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
