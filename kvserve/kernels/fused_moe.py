"""Mixture-of-experts feed-forward: every token through its top-k experts' SwiGLU MLPs, the
outputs summed with the router weights.

Weights are stacked per expert: ``w13`` [E, 2I, H] (gate rows, then up rows) and ``w2``
[E, H, I]. ``fused_moe_reference`` loops over experts in plain torch (runs anywhere).
``fused_moe`` is the GPU path: token slots (token, choice) sorted by expert and padded per
expert to whole ``BLOCK_M`` row blocks, then one grouped GEMM over all experts for gate/up,
SiLU-mul, and one grouped GEMM for down whose epilogue scales each row by its router weight;
the k rows of a token are summed last. When there are few slots per expert (decode at small
batch), each slot is its own block and nothing is sorted: the sort's dozen small kernels per
layer cost more than the rare second read of an expert two slots share; there the down GEMM
sums a token's k rows itself and adds a shared expert's output (``SlotOutput``), one kernel
fewer, two for GLM-4.5. Every size is fixed by the token count, so a CUDA graph can capture it
(no host syncs).

Sorted layout, for ``block_m`` = 4, experts 0..2 holding 3, 0 and 5 slots (``.`` = padding,
whose slot id is ``num_slots`` and whose rows are neither read nor written)::

    sorted_slots: [s s s .][s s s s][s . . .][. . . .] ...   (static length)
    block_expert: [   0   ][   2   ][   2   ][  -1   ] ...   (-1: past the last block)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvserve.kernels._triton import (
    jit,
    launch_options,
    pdl_release,
    pdl_wait,
    require_triton,
    tl,
    triton,
)
from kvserve.kernels.activation import silu_and_mul
from kvserve.kernels.moe_tiles import MoeTiles, expert_tiles
from kvserve.kernels.skinny_gemm import _arrival_counters, arrive


def fused_moe_reference(
    x: torch.Tensor,  # [T, H]
    w13: torch.Tensor,  # [E, 2I, H]
    w2: torch.Tensor,  # [E, H, I]
    topk_weights: torch.Tensor,  # [T, k] float32
    topk_ids: torch.Tensor,  # [T, k] int
    act_quant: Callable[[torch.Tensor], torch.Tensor] | None = None,
    inter_dtype: torch.dtype | None = None,
    addend: torch.Tensor | None = None,
) -> torch.Tensor:
    """``act_quant``: applied to each GEMM's input rows (FP8 experts: quantize-dequantize the
    activations as the kernel quantizes them; the weights come in already dequantized).
    ``inter_dtype``: the dtype the kernels store the gate/up output and the SiLU-mul result in
    (the model's activation dtype), when the reference computes in a wider one: before FP8
    quantization, that rounding decides which way values round (several % at bf16).
    ``addend`` [T, H]: added to the sum (a shared expert's output)."""
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    inter = w2.shape[2]
    quant = act_quant or (lambda t: t)

    def rounded(t: torch.Tensor) -> torch.Tensor:
        return t if inter_dtype is None else t.to(inter_dtype).to(t.dtype)

    x_in = quant(x).to(w13.dtype)
    for expert in topk_ids.unique().tolist():
        token, choice = (topk_ids == expert).nonzero(as_tuple=True)
        gate_up = rounded(x_in[token] @ w13[expert].t())
        hidden = rounded(F.silu(gate_up[:, :inter]) * gate_up[:, inter:])
        y = (quant(hidden).to(w2.dtype) @ w2[expert].t()).float()
        out.index_add_(0, token, y * topk_weights[token, choice, None])
    if addend is not None:
        out += addend.float()
    return out.to(x.dtype)


@dataclass(frozen=True)
class SortedSlots:
    slots: torch.Tensor  # [max_rows] int32 slot id (token * k + choice), num_slots = padding
    block_expert: torch.Tensor  # [max_rows // block_m] int32 expert of each block, -1 = none
    block_m: int


def sort_slots_by_expert(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> SortedSlots:
    """Group the T*k slots by expert, each expert's run padded to whole blocks (see above)."""
    flat = topk_ids.flatten().to(torch.int64)
    num_slots = flat.numel()
    dev = flat.device
    counts = torch.zeros(num_experts, dtype=torch.int64, device=dev)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = padded.cumsum(0)
    padded_start = padded_end - padded
    order = flat.argsort(stable=True)
    sorted_expert = flat[order]
    rank = torch.arange(num_slots, device=dev) - (counts.cumsum(0) - counts)[sorted_expert]
    max_rows = num_slots + num_experts * (block_m - 1)
    max_rows = (max_rows + block_m - 1) // block_m * block_m
    slots = torch.full((max_rows,), num_slots, dtype=torch.int32, device=dev)
    slots[padded_start[sorted_expert] + rank] = order.to(torch.int32)
    block_start = torch.arange(0, max_rows, block_m, device=dev)
    block_expert = torch.searchsorted(padded_end, block_start, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1).to(torch.int32)
    return SortedSlots(slots, block_expert, block_m)


@jit
def _lay_out_blocks(
    counts,  # [BINS] int32 slots per expert (0 past NUM_EXPERTS)
    cursor_ptr,  # [BINS] int32 out: first row of each expert
    block_expert_ptr,  # [max_rows // BLOCK_M] int32 out
    max_rows,
    NUM_EXPERTS: tl.constexpr,
    BINS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_CHUNK: tl.constexpr,  # blocks per loop step (a [BLOCK_CHUNK, BINS] compare)
):
    """Pad each expert's count to whole blocks, store where its rows start, and name each
    block's expert."""
    experts = tl.arange(0, BINS)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    end = tl.cumsum(padded, axis=0)
    tl.store(cursor_ptr + experts, end - padded)
    for start in range(0, max_rows // BLOCK_M, BLOCK_CHUNK):
        blocks = start + tl.arange(0, BLOCK_CHUNK)
        row = blocks * BLOCK_M
        owner = tl.sum((end[None, :] <= row[:, None]).to(tl.int32), axis=1)
        owner = tl.where(owner < NUM_EXPERTS, owner, -1)
        tl.store(block_expert_ptr + blocks, owner, mask=blocks < max_rows // BLOCK_M)


@jit
def _place_slots(ids_ptr, slots_ptr, cursor_ptr, offs, num_slots):
    """Each slot of ``offs`` to the next free row of its expert. Rows within an expert are
    handed out by atomics, so their order varies from run to run; each row is computed on its
    own, so the result does not."""
    live = offs < num_slots
    ids = tl.load(ids_ptr + offs, mask=live, other=0)
    row = tl.atomic_add(cursor_ptr + ids, 1, mask=live)
    tl.store(slots_ptr + row, offs, mask=live)


@jit
def _sort_slots_kernel(
    ids_ptr,  # [num_slots] int32 expert of each slot
    slots_ptr,  # [max_rows] int32 out
    block_expert_ptr,  # [max_rows // BLOCK_M] int32 out
    cursor_ptr,  # [BINS] int32 scratch: next free row of each expert
    num_slots,
    max_rows,
    NUM_EXPERTS: tl.constexpr,
    BINS: tl.constexpr,  # a power of two > NUM_EXPERTS; bin NUM_EXPERTS collects masked lanes
    BLOCK_M: tl.constexpr,
    CHUNK: tl.constexpr,  # slots per loop step
    BLOCK_CHUNK: tl.constexpr,
):
    """One program: count slots per expert, lay out the blocks, pad, place every slot."""
    experts = tl.arange(0, BINS)
    counts = tl.zeros([BINS], dtype=tl.int32)
    for start in range(0, num_slots, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        ids = tl.load(ids_ptr + offs, mask=offs < num_slots, other=NUM_EXPERTS)
        counts += tl.histogram(ids, BINS)
    counts = tl.where(experts < NUM_EXPERTS, counts, 0)
    _lay_out_blocks(
        counts, cursor_ptr, block_expert_ptr, max_rows, NUM_EXPERTS, BINS, BLOCK_M, BLOCK_CHUNK
    )
    for start in range(0, max_rows, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        tl.store(slots_ptr + offs, tl.full([CHUNK], 0, tl.int32) + num_slots, mask=offs < max_rows)
    tl.debug_barrier()  # the padding and cursors are written before any slot is placed
    for start in range(0, num_slots, CHUNK):
        _place_slots(ids_ptr, slots_ptr, cursor_ptr, start + tl.arange(0, CHUNK), num_slots)


@jit
def _count_slots_kernel(
    ids_ptr, counts_ptr, num_slots, NUM_EXPERTS: tl.constexpr, BINS: tl.constexpr,
    CHUNK: tl.constexpr,
):  # fmt: skip
    offs = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    ids = tl.load(ids_ptr + offs, mask=offs < num_slots, other=NUM_EXPERTS)
    counts = tl.histogram(ids, BINS)
    experts = tl.arange(0, BINS)
    tl.atomic_add(counts_ptr + experts, counts, mask=(experts < NUM_EXPERTS) & (counts > 0))


@jit
def _lay_out_blocks_kernel(
    counts_ptr, cursor_ptr, block_expert_ptr, max_rows, NUM_EXPERTS: tl.constexpr,
    BINS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_CHUNK: tl.constexpr,
):  # fmt: skip
    counts = tl.load(counts_ptr + tl.arange(0, BINS))
    _lay_out_blocks(
        counts, cursor_ptr, block_expert_ptr, max_rows, NUM_EXPERTS, BINS, BLOCK_M, BLOCK_CHUNK
    )


@jit
def _place_slots_kernel(ids_ptr, slots_ptr, cursor_ptr, num_slots, CHUNK: tl.constexpr):
    offs = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    _place_slots(ids_ptr, slots_ptr, cursor_ptr, offs, num_slots)


# From this many slots the sort runs as three grid-wide passes (count, lay out, place) instead
# of one program: that program took 0.37 ms at 65,536 slots (Qwen3-30B-A3B, an 8K-token
# prefill step) on the H200, 16.6 ms of a 158 ms prefill (decode_profile_h200_qwen_prefill,
# 2026-12-02); a decode batch of 256 has 2,048 slots and keeps the one launch.
PARALLEL_SORT_MIN_SLOTS = 4096
_SORT_CHUNK = 1024


def sort_slots_by_expert_kernel(
    topk_ids: torch.Tensor, num_experts: int, block_m: int, parallel: bool | None = None
) -> SortedSlots:
    """``sort_slots_by_expert`` in Triton (the same padded layout; rows within an expert in any
    order): one program, or three grid-wide passes from ``PARALLEL_SORT_MIN_SLOTS`` slots
    (``parallel`` forces either)."""
    require_triton()
    flat = topk_ids.flatten().to(torch.int32)
    num_slots = flat.numel()
    max_rows = -(-(num_slots + num_experts * (block_m - 1)) // block_m) * block_m
    block_expert = torch.empty(max_rows // block_m, dtype=torch.int32, device=flat.device)
    bins = 1 << num_experts.bit_length()  # > num_experts
    cursor = torch.empty(bins, dtype=torch.int32, device=flat.device)
    shape = {"NUM_EXPERTS": num_experts, "BINS": bins}
    layout = shape | {"BLOCK_M": block_m, "BLOCK_CHUNK": max(16, 8192 // bins)}
    if not (num_slots >= PARALLEL_SORT_MIN_SLOTS if parallel is None else parallel):
        slots = torch.empty(max_rows, dtype=torch.int32, device=flat.device)
        _sort_slots_kernel[(1,)](
            flat, slots, block_expert, cursor, num_slots, max_rows, CHUNK=_SORT_CHUNK,
            num_warps=4, **layout,
        )  # fmt: skip
        return SortedSlots(slots, block_expert, block_m)
    grid = (triton.cdiv(num_slots, _SORT_CHUNK),)
    counts = torch.zeros(bins, dtype=torch.int32, device=flat.device)
    _count_slots_kernel[grid](flat, counts, num_slots, CHUNK=_SORT_CHUNK, num_warps=4, **shape)
    _lay_out_blocks_kernel[(1,)](counts, cursor, block_expert, max_rows, num_warps=4, **layout)
    slots = torch.full((max_rows,), num_slots, dtype=torch.int32, device=flat.device)
    _place_slots_kernel[grid](flat, slots, cursor, num_slots, CHUNK=_SORT_CHUNK, num_warps=4)
    return SortedSlots(slots, block_expert, block_m)


@jit
def _block_slots(
    slots_ptr,
    pid_m,
    num_slots,
    TOP_K: tl.constexpr,
    A_PER_TOKEN: tl.constexpr,
    ONE_SLOT_PER_BLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """Row block ``pid_m``'s slots (``num_slots`` marks padding), which of them are real, and
    the rows of A they read (tokens or slots; padding reads row 0, masked)."""
    if ONE_SLOT_PER_BLOCK:  # block i is slot i alone (its expert: topk_ids[i]); rows 1.. pad
        slots = tl.where(tl.arange(0, BLOCK_M) == 0, pid_m, num_slots)
    else:
        slots = tl.load(slots_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    row_ok = slots < num_slots
    a_rows = slots // TOP_K if A_PER_TOKEN else slots
    return slots, row_ok, tl.where(row_ok, a_rows, 0)


@jit
def _store_slots(
    out_ptr, acc, slots, row_ok, offs_n, N, weights_ptr, stride_out, sums_ptr, counter_ptr,
    SCALE_ROWS: tl.constexpr, SUM_TOKENS: tl.constexpr, TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Each real slot's row of the fp32 tile, times its router weight when SCALE_ROWS; with
    SUM_TOKENS (one slot per block) its token's k rows summed instead (``_sum_token_rows``):
    1 writes the sum, 2 adds it to what ``out`` holds."""
    if SCALE_ROWS:
        acc = acc * tl.load(weights_ptr + slots, mask=row_ok, other=0.0)[:, None]
    if SUM_TOKENS:
        # The block's one real row is row 0 (``_block_slots``)
        row = tl.sum(tl.where((tl.arange(0, BLOCK_M) == 0)[:, None], acc, 0.0), axis=0)
        slot = tl.max(tl.where(tl.arange(0, BLOCK_M) == 0, slots, 0), axis=0)
        _sum_token_rows(out_ptr, row, slot, offs_n, N, stride_out, sums_ptr, counter_ptr,
                        TOP_K, BLOCK_N, SUM_TOKENS == 2)  # fmt: skip
    else:
        out_ptrs = out_ptr + slots.to(tl.int64)[:, None] * stride_out + offs_n[None, :]
        mask = row_ok[:, None] & (offs_n < N)[None, :]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@jit
def _sum_token_rows(
    out_ptr, row, slot, offs_n, N, stride_out, sums_ptr, counter_ptr,
    TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, ACCUMULATE: tl.constexpr,
):  # fmt: skip
    """Slot ``slot``'s fp32 output columns ``offs_n`` go to the workspace ``sums_ptr``
    [num_slots, N]; the last of its token's k slots to arrive at this column tile sums the k
    rows in choice order (deterministic: the order does not depend on who arrives last), plus
    the token's output row when ACCUMULATE, into that row, and resets the tile's counter for
    the next launch."""
    n_ok = offs_n < N
    tl.store(sums_ptr + slot.to(tl.int64) * N + offs_n, row, mask=n_ok)
    token = slot // TOP_K
    counter = counter_ptr + token * tl.cdiv(N, BLOCK_N) + tl.min(offs_n, axis=0) // BLOCK_N
    if arrive(counter) == TOP_K - 1:
        first = sums_ptr + (token * TOP_K).to(tl.int64) * N + offs_n
        total = tl.zeros([BLOCK_N], dtype=tl.float32)
        for choice in tl.static_range(TOP_K):
            # .cg: from L2, where the other programs' stores are
            total += tl.load(first + choice * N, mask=n_ok, other=0.0, cache_modifier=".cg")
        out_row = out_ptr + token.to(tl.int64) * stride_out + offs_n
        if ACCUMULATE:
            total += tl.load(out_row, mask=n_ok, other=0.0).to(tl.float32)
        tl.store(out_row, total.to(out_ptr.dtype.element_ty), mask=n_ok)
        tl.store(counter, 0)


def block_tables(blocks: SortedSlots | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(expert of each row block, slot table, one slot per block) for the grouped GEMMs:
    ``blocks`` is sorted slots, or the flat expert ids [num_slots] for one slot per block."""
    if isinstance(blocks, torch.Tensor):
        return blocks, blocks, True
    return blocks.block_expert, blocks.slots, False


@jit
def _program_tile(block_expert_ptr, N, BLOCK_N: tl.constexpr):
    """(row block, column tile, expert; -1 past the last block) of this program. Column tiles
    vary fastest: the tiles of a row block run side by side, so its A rows come from DRAM once
    (with row blocks fastest, once per column tile: 12 times for Qwen3-30B-A3B's gate/up at
    prefill), and an expert's row blocks follow each other, so its weight tiles stay in L2."""
    tiles_n = tl.cdiv(N, BLOCK_N)
    pid = tl.program_id(0)
    pid_m = pid // tiles_n
    return pid_m, pid - pid_m * tiles_n, tl.load(block_expert_ptr + pid_m)


def grouped_grid(block_expert: torch.Tensor, n: int, block_n: int) -> tuple[int]:
    """The launch grid of a grouped GEMM kernel (see ``_program_tile``)."""
    return (block_expert.numel() * triton.cdiv(n, block_n),)


# expert_lo / expert_hi unspecialized: a chunk of experts starts at any index
@jit(do_not_specialize=("expert_lo", "expert_hi"))
def _grouped_gemm_kernel(
    a_ptr,  # [rows of A, K]: tokens (A_PER_TOKEN) or slots
    w_ptr,  # [expert_hi - expert_lo, N, K]
    out_ptr,  # [num_slots, N]
    slots_ptr,
    block_expert_ptr,
    weights_ptr,  # [num_slots] float32 router weights (SCALE_ROWS)
    sums_ptr,  # SUM_TOKENS: fp32 [num_slots, N] workspace
    counter_ptr,  # SUM_TOKENS: int32 arrival counters, zero between launches
    num_slots,
    N,
    K,
    expert_lo,  # the blocks of experts outside [expert_lo, expert_hi) are left to other calls
    expert_hi,
    stride_a,
    stride_we,
    stride_wn,
    stride_out,
    TOP_K: tl.constexpr,
    A_PER_TOKEN: tl.constexpr,
    SCALE_ROWS: tl.constexpr,
    ONE_SLOT_PER_BLOCK: tl.constexpr,
    SUM_TOKENS: tl.constexpr,  # 1, 2: out is [tokens, N], each token's k rows summed (SlotOutput)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,  # "ieee" for float32 (no TF32 rounding of the inputs)
    USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    pdl_release(USE_PDL)
    pid_m, pid_n, expert = _program_tile(block_expert_ptr, N, BLOCK_N)
    if (expert < expert_lo) | (expert >= expert_hi):  # also past the last block (-1)
        return
    slots, row_ok, a_rows = _block_slots(
        slots_ptr, pid_m, num_slots, TOP_K, A_PER_TOKEN, ONE_SLOT_PER_BLOCK, BLOCK_M
    )
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_rows.to(tl.int64)[:, None] * stride_a + offs_k[None, :]
    w_ptrs = (
        w_ptr
        + (expert - expert_lo).to(tl.int64) * stride_we
        + offs_n.to(tl.int64)[None, :] * stride_wn
        + offs_k[:, None]
    )
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        a_mask = row_ok[:, None] & k_ok[None, :]
        a = tl.load(a_ptrs, mask=a_mask, other=0.0)
        w = tl.load(w_ptrs, mask=k_ok[:, None] & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    _store_slots(
        out_ptr, acc, slots, row_ok, offs_n, N, weights_ptr, stride_out, sums_ptr, counter_ptr,
        SCALE_ROWS, SUM_TOKENS, TOP_K, BLOCK_M, BLOCK_N,
    )  # fmt: skip


def _block_config(num_slots: int, num_experts: int) -> dict[str, int]:
    """Tiles by rows per expert: small decode batches are weight-bound (short M, wide K tiles),
    large prefill batches compute-bound."""
    per_expert = num_slots / num_experts
    if per_expert <= 16:
        return {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 4}
    if per_expert <= 64:
        return {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 4}
    return {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3}


def half_weight_config(config: dict[str, int], dtype: torch.dtype) -> dict[str, int]:
    """The tile for weights held in a 2-byte dtype: past 64 rows an expert, 128 x 256 instead of
    128 x 128. On the H200 at an 8K-token step it took the bf16 gate/up and down GEMMs from
    0.979 / 0.551 to 0.889 / 0.509 ms (Qwen3-30B-A3B) and 3.644 / 2.014 to 3.345 / 1.736 ms
    (GLM-4.5-Air); the FP4 kernel, which decodes W in registers, ran 1.6x slower with it
    (moe_gemm_h200_prefill_order_2026-12-02.json). Four-byte weights would not fit its stages
    in shared memory."""
    if config["BLOCK_M"] == 128 and dtype.itemsize == 2:
        return config | {"BLOCK_N": 256}
    return config


@dataclass(frozen=True)
class TokenSum:
    """A down GEMM of one slot per block sums each token's k rows itself (``_sum_token_rows``);
    ``into``: a contiguous [tokens, N] tensor the sums are added to in place (a shared expert's
    output), else they go to a new one."""

    into: torch.Tensor | None = None


@dataclass(frozen=True)
class SlotOutput:
    """Where a grouped GEMM's epilogue writes: ``out`` [num_slots, N], one row per slot; or,
    with a ``TokenSum``, ``out`` [tokens, N], each token's k rows summed by the kernel through
    the fp32 workspace ``sums`` and the arrival ``counters``: at decode this spares the separate
    sum kernel (and the add of a shared expert)."""

    out: torch.Tensor
    sums: torch.Tensor  # fp32 [num_slots, N]; ``out`` as a placeholder without a token sum
    counters: torch.Tensor
    sum_mode: int  # the kernels' SUM_TOKENS: 0 none, 1 write the sums, 2 add them to ``out``

    @staticmethod
    def plan(
        a: torch.Tensor, num_slots: int, n: int, top_k: int, block_n: int,
        token_sum: TokenSum | None, out: torch.Tensor | None = None,
    ) -> SlotOutput:  # fmt: skip
        if token_sum is None:
            out = torch.empty(num_slots, n, dtype=a.dtype, device=a.device) if out is None else out
            return SlotOutput(out, out, out, 0)
        tokens = num_slots // top_k
        out = token_sum.into
        if out is None:
            out = torch.empty(tokens, n, dtype=a.dtype, device=a.device)
        elif out.shape != (tokens, n) or out.stride() != (n, 1) or out.dtype != a.dtype:
            raise ValueError(f"token sums go to a contiguous [{tokens}, {n}] {a.dtype} tensor")
        sums = torch.empty(num_slots, n, dtype=torch.float32, device=a.device)
        counters = _arrival_counters(a.device, tokens * triton.cdiv(n, block_n))
        return SlotOutput(out, sums, counters, 1 if token_sum.into is None else 2)


def _grouped_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    blocks: SortedSlots | torch.Tensor,
    num_slots: int,
    top_k: int,
    config: dict[str, int],
    row_weights: torch.Tensor | None,
    out: torch.Tensor | None = None,
    experts: tuple[int, int] | None = None,
    token_sum: TokenSum | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """``blocks``: slots sorted into expert blocks, or the flat expert ids [num_slots] for one
    slot per block (no sorting: small batches, where few slots share an expert). ``experts``:
    ``(lo, hi)`` when ``w`` holds experts lo..hi-1 only; the rows of the others in ``out`` are
    left as they are. ``token_sum``: see ``SlotOutput``."""
    n, k = w.shape[1], w.shape[2]
    lo, hi = experts or (0, w.shape[0])
    tiles = {key: config[key] for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K")}
    block_expert, slots, one_slot = block_tables(blocks)
    grid = grouped_grid(block_expert, n, tiles["BLOCK_N"])
    dest = SlotOutput.plan(a, num_slots, n, top_k, tiles["BLOCK_N"], token_sum, out)
    _grouped_gemm_kernel[grid](
        a, w, dest.out, slots, block_expert, row_weights if row_weights is not None else a,
        dest.sums, dest.counters, num_slots, n, k, lo, hi, a.stride(0), w.stride(0),
        w.stride(1), dest.out.stride(0), TOP_K=top_k, A_PER_TOKEN=row_weights is None,
        SCALE_ROWS=row_weights is not None, ONE_SLOT_PER_BLOCK=one_slot,
        SUM_TOKENS=dest.sum_mode, num_warps=config["num_warps"],
        DOT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
        num_stages=config["num_stages"], **tiles, **launch_options(pdl),
    )  # fmt: skip
    return dest.out


# (GEMM input rows, 0 for w13 / 1 for w2, slot blocks, num_slots, top_k, tile config, router
# weights to scale the output rows by or None, TokenSum or None) -> [num_slots, N], or with a
# TokenSum (one slot per block, the down GEMM) [tokens, N], each token's k rows summed; see
# _grouped_gemm and SlotOutput
ExpertGemm = Callable[
    [torch.Tensor, int, "SortedSlots | torch.Tensor", int, int, dict, "torch.Tensor | None",
     "TokenSum | None"],
    torch.Tensor,
]  # fmt: skip


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    pdl: bool = False,
    addend: torch.Tensor | None = None,
    shared: bool = False,
) -> torch.Tensor:
    """The GPU path of ``fused_moe_reference`` (same arguments, same result within bf16
    rounding of the intermediate). ``pdl``: programmatic dependent launch of its kernels;
    ``shared``: the stacks' last expert is a stacked shared expert (``moe_tiles.expert_tiles``)."""
    assert x.stride(-1) == 1 and w13.stride(-1) == 1 and w2.stride(-1) == 1
    tiles = half_weight_tiles(w13.shape, w13.dtype, topk_ids, x.device, shared)
    gemm = expert_gemm(w13, w2, pdl)
    return fused_moe_with(
        x, topk_weights, topk_ids, w13.shape[0], w2.shape[1], gemm, tiles, pdl, addend
    )


def expert_gemm(w13: torch.Tensor, w2: torch.Tensor, pdl: bool = False) -> ExpertGemm:
    """``fused_moe``'s grouped GEMM over these stacks."""

    def gemm(a, which, blocks, num_slots, top_k, config, row_weights, token_sum):  # noqa: ANN001, ANN202
        return _grouped_gemm(a, (w13, w2)[which], blocks, num_slots, top_k, config, row_weights,
                             token_sum=token_sum, pdl=pdl)  # fmt: skip

    return gemm


def half_weight_tiles(
    shape: torch.Size,
    dtype: torch.dtype,
    topk_ids: torch.Tensor,
    device: torch.device,
    shared: bool = False,
) -> MoeTiles:
    """The tiles of ``_grouped_gemm`` over half-precision experts, ``shape`` that of the
    gate/up stack [E, N, K]."""
    fallback = half_weight_config(_block_config(topk_ids.numel(), shape[0]), dtype)
    kind = str(dtype).removeprefix("torch.")
    return expert_tiles(kind, shape, topk_ids, device, fallback, shared)


def one_slot_per_block(num_slots: int, num_experts: int) -> bool:
    """Decode: slots rarely share an expert, so they are not sorted."""
    return num_slots * 4 <= num_experts


def slot_blocks(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> SortedSlots | torch.Tensor:
    """What the grouped GEMMs take as ``blocks``: the flat expert ids, one slot per block, or
    the slots sorted into ``block_m``-row blocks of one expert."""
    if one_slot_per_block(topk_ids.numel(), num_experts):
        return topk_ids.flatten().to(torch.int32)
    return sort_slots_by_expert_kernel(topk_ids, num_experts, block_m)


def fused_moe_with(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    num_experts: int,
    hidden_size: int,
    gemm: ExpertGemm,
    tiles: MoeTiles,
    pdl: bool = False,
    addend: torch.Tensor | None = None,
    gated_down: bool = False,
    gated_gate_up: bool = False,
) -> torch.Tensor:
    """Route, sort (or not), gate/up GEMM, SiLU-mul, down GEMM scaled by the router weights,
    sum of the k rows (plus ``addend`` [T, H], a shared expert's output, which a decode step
    overwrites with the result): the steps every expert format shares; ``gemm`` multiplies by
    one expert stack in its own format, at ``tiles``. Decode steps (one slot per block) sum the
    k rows in the down GEMM; sorted steps in one torch reduction. ``gated_down``: ``gemm``'s
    down projection takes the gate/up output and applies the SiLU-mul itself;
    ``gated_gate_up``: its gate/up projection returns the SiLU-mul output."""
    require_triton()
    tokens, top_k = topk_ids.shape
    num_slots = tokens * top_k
    if tokens == 0:
        return torch.zeros(0, hidden_size, dtype=x.dtype, device=x.device)
    blocks = slot_blocks(topk_ids, num_experts, tiles.block_m)
    gate_up = gemm(x, 0, blocks, num_slots, top_k, tiles.gate_up, None, None)
    flat_weights = topk_weights.flatten().float().contiguous()
    hidden = gate_up if gated_down or gated_gate_up else silu_and_mul(gate_up, pdl=pdl)
    if isinstance(blocks, torch.Tensor):
        addend = addend if addend is None or addend.is_contiguous() else addend.contiguous()
        token_sum = TokenSum(addend)
        return gemm(hidden, 1, blocks, num_slots, top_k, tiles.down, flat_weights, token_sum)
    down = gemm(hidden, 1, blocks, num_slots, top_k, tiles.down, flat_weights, None)
    out = down.view(tokens, top_k, -1).sum(dim=1)  # accumulates in fp32, one kernel
    return out if addend is None else out.add_(addend)
