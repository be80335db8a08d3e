"""Paged decode attention (one new query row per sequence), flash-decoding style.

Reference: ``TorchAttentionBackend._decode`` in ``kvserve/layers/attention/torch_backend.py``.

Grid ``(B, Hkv, S)``: one program serves all ``G = Hq / Hkv`` query heads of a kv head (the G rows
padded to >= 16 for ``tl.dot``), so each K/V tile is read once per group. Each sequence is cut
into S splits; S comes from shapes only (batch, heads, page-table capacity, SM count) and each
program derives its own token range from ``seq_lens`` on the device, so the launch is
CUDA-graph capturable. A second kernel merges the splits' partial outputs by their
log-sum-exp (or, with ``DecodeConfig.fused_merge``, the split program that arrives last does).
With S == 1 the first kernel writes the output directly.

An FP8 cache is widened to q's dtype tile by tile (exact: every e4m3 value is a bf16 value); the
key scale is folded into the softmax scale and the value scale applied once to each output row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kvserve.kernels._triton import (
    early_loads,
    jit,
    launch_options,
    next_pow2,
    pdl_release,
    pdl_wait,
    prefetch_l2,
    require_triton,
    sm_count,
    tl,
)
from kvserve.kernels.skinny_gemm import _arrival_counters, arrive
from kvserve.kernels.store_kv_cache import (
    FP8_AS_FP16,
    FP8_MMA,
    KVScales,
    fp8_operand_mode,
    is_fp8_kv,
    scale_args,
)

# Split count, from sweeps on the H200 with the engine's graph-wide page tables
# (benchmarks/decode_attention_sweep.py, benchmarks/long_context_sweep.py): about 4 programs
# per SM is best at every batch (batch 64 x 8 kv heads: one split, no merge, 15% faster than
# three); a split shorter than one tile only adds merge work. At long context the same rule holds
# (32K x 32 at 2 splits and 128K x 8 at 8 splits read at 101-103% of copy bandwidth), and a
# single 128K sequence wants 64 splits (136 us, 92% of copy, against 168 us at 32); at 1K the
# splits past the sequence's end exit at once (batch 1: 16 splits 8.6 us, 32 splits 9.0 us).
_MIN_SPLIT_TOKENS = 64
_MAX_SPLITS = 64
_PROGRAMS_PER_SM = 4
_MERGE_MIN_BLOCK = 32  # merge kernels compiled: splits <= 32 share one, and one for 33-64


@dataclass(frozen=True)
class DecodeConfig:
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3
    num_splits: int | None = None  # None: choose from shapes
    # No split shorter than this (rounded up to whole tiles): a sequence shorter than
    # num_splits * min_split_tokens fills fewer splits, and the programs of the rest exit.
    min_split_tokens: int = 0
    fp8_mode: int = FP8_AS_FP16  # how an FP8 cache is widened (store_kv_cache.FP8_AS_*)
    programs_per_sm: int = _PROGRAMS_PER_SM  # the split count's occupancy target
    # With 2..fused_merge_max_splits splits, the split program that arrives last merges them
    # (an arrival counter per sequence and kv head) instead of a second kernel.
    fused_merge: bool = False
    fused_merge_max_splits: int = 16
    heads_inner: bool = False  # FP8_MMA only: grid (Hkv, B, S)


# An FP8 cache's tiles hold half the bytes: 128 tokens per tile, two stages, about 8 programs
# per SM and the fused merge. On the H200 (benchmarks/fp8_kv_decode.py, one run) that read
# 32 x 32K and 8 x 128K at 1.24x / 1.23x of bf16's speed, against 0.94x / 0.93x with four
# stages, 4 programs per SM and the merge kernel (the earlier default); 8 x 4K and 64 x 1K even
# (1.01x / 0.95x against 0.99x / 0.94x). The fused merge is what pays: with the merge kernel
# the same split count gave 0.95x. With the page size a constant (2026-12-02, 16 configs of
# tile, stages and occupancy swept again) this config stays the best: 1.40x / 1.39x at long
# context, 72% of copy bandwidth. Still not bytes-bound (2x would be); about half the loop's
# instructions are the byte-wise reads of the value tile (store_kv_cache.FP8_AS_*).
FP8_DECODE_CONFIG = DecodeConfig(
    block_n=128, num_warps=4, num_stages=2, programs_per_sm=8, fused_merge=True
)
# One program merging more splits than ``fused_merge_max_splits`` (16) is a serial tail: FP8 at
# batch 1 and 1K (64 splits) took 0.77x of bf16's speed fused, 0.94x with the merge kernel. For
# bf16 at batches 1-16 the merge kernel stays: fused merges, fewer filled splits and fixed split
# counts were all slower than the default at 1K-128K (decode_attention_sweep_small_h200,
# ``benchmarks/decode_attention_sweep.py --small``).


@jit(do_not_specialize=("stride_bt", "num_splits", "min_split"))
def _decode_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    counter_ptr,  # int32 [B * Hkv], zero between launches; used by FUSED_MERGE only
    k_scale_ptr,
    v_scale_ptr,
    scale_log2,
    stride_qb,
    stride_qh,
    stride_cache_page,
    stride_cache_tok,
    stride_cache_head,
    stride_bt,
    stride_ob,
    stride_oh,
    num_splits,
    min_split,  # a multiple of BLOCK_N
    PAGE_SIZE: tl.constexpr,  # a constant: // and % by it are shifts, not division sequences
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIRECT: tl.constexpr,  # num_splits == 1: write the output, skip the merge
    DOT_PRECISION: tl.constexpr,
    FP8: tl.constexpr,
    FP8_MODE: tl.constexpr,
    USE_PDL: tl.constexpr,
    FUSED_MERGE: tl.constexpr,  # the split that arrives last merges (no merge kernel)
    BLOCK_S: tl.constexpr,  # FUSED_MERGE: splits merged at once, >= num_splits
    EARLY_LOADS: tl.constexpr,  # lengths, pages and the first tile's L2 fill before the wait
    LINE: tl.constexpr,  # cache elements in a 128-byte line (at most HEAD_DIM)
):
    if not EARLY_LOADS:
        pdl_wait(USE_PDL)
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_kv_heads = tl.num_programs(1)

    seq_len = tl.load(seq_lens_ptr + b)
    # The sequence cut into num_splits runs of whole tiles: a short one fills only its first
    # few splits, and the programs of the others exit at once.
    split_len = tl.maximum(tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N, min_split)
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)
    if split > 0 and start >= end:
        return  # past the sequence's end: the merge reads only the splits before this one
    table = block_tables_ptr + b.to(tl.int64) * stride_bt
    if EARLY_LOADS:
        _first_tile_to_l2(
            k_cache_ptr, v_cache_ptr, table, start, end, kv_head, stride_cache_page,
            stride_cache_tok, stride_cache_head, PAGE_SIZE, BLOCK_N, HEAD_DIM, LINE,
        )  # fmt: skip
        pdl_wait(USE_PDL)

    rows = tl.arange(0, BLOCK_H)  # row r = query head kv_head * GROUP + r
    dims = tl.arange(0, HEAD_DIM)
    row_mask = rows < GROUP
    heads = kv_head * GROUP + rows
    q_off = b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + dims[None, :]
    q = tl.load(q_ptr + q_off, mask=row_mask[:, None], other=0.0)  # [BLOCK_H, D]
    if FP8:
        scale_log2 = scale_log2 * tl.load(k_scale_ptr)
        if FP8_MODE == 1:
            q = q.to(tl.float16)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        toks = n0 + tl.arange(0, BLOCK_N)
        tok_mask = toks < end
        page = tl.load(table + toks // PAGE_SIZE, mask=tok_mask, other=0).to(tl.int64)
        kv_off = page * stride_cache_page + (toks % PAGE_SIZE) * stride_cache_tok
        kv_off = kv_off + kv_head * stride_cache_head
        kv_ptrs = kv_off[:, None] + dims[None, :]  # [BLOCK_N, D]
        k = tl.load(k_cache_ptr + kv_ptrs, mask=tok_mask[:, None], other=0.0)
        v = tl.load(v_cache_ptr + kv_ptrs, mask=tok_mask[:, None], other=0.0)
        if FP8:
            k, v = k.to(q.dtype), v.to(q.dtype)  # fp16 already for FP8_AS_FP16

        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # [BLOCK_H, N], unscaled
        s = tl.where(tok_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1) * scale_log2)  # finite: every tile has a token
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s * scale_log2 - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    pdl_release(USE_PDL)  # the epilogue's stores are all that is left
    o, lse = normalize_rows(acc, m_i, l_i)  # seq_len 0 (a padding row): split 0 writes zeros
    if FP8:
        o = o * tl.load(v_scale_ptr)
    if DIRECT:
        out_off = b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + dims[None, :]
        tl.store(out_ptr + out_off, o.to(out_ptr.dtype.element_ty), mask=row_mask[:, None])
    else:
        # part_out: [B, Hq, S, D] fp32, part_lse: [B, Hq, S] fp32 (log2 units)
        part_row = (b.to(tl.int64) * num_kv_heads * GROUP + heads) * num_splits + split
        tl.store(part_lse_ptr + part_row, lse, mask=row_mask)
        part_ptrs = part_out_ptr + part_row[:, None] * HEAD_DIM + dims[None, :]
        tl.store(part_ptrs, o, mask=row_mask[:, None])
        if FUSED_MERGE:
            _merge_if_last(
                part_out_ptr, part_lse_ptr, out_ptr, counter_ptr, b, kv_head, num_kv_heads,
                seq_len, split_len, num_splits, stride_ob, stride_oh, GROUP, BLOCK_S, HEAD_DIM,
            )  # fmt: skip


@jit
def _first_tile_to_l2(
    k_cache_ptr, v_cache_ptr, table, start, end, kv_head, stride_cache_page, stride_cache_tok,
    stride_cache_head, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    LINE: tl.constexpr,
):  # fmt: skip
    """Ask L2 for a split's first tile of keys and values before the dependent-launch wait.
    Page tables and those keys and values were written before the step
    (``_triton.early_loads_enabled``), but for the newest token's, which the kernel before
    stores: an L2 fill is coherent with that store, so the tile goes to L2 whole."""
    toks = start + tl.arange(0, BLOCK_N)
    page = tl.load(table + toks // PAGE_SIZE, mask=toks < end, other=0).to(tl.int64)
    kv_off = page * stride_cache_page + (toks % PAGE_SIZE) * stride_cache_tok
    kv_off = kv_off + kv_head * stride_cache_head
    lines = kv_off[:, None] + tl.arange(0, HEAD_DIM // LINE)[None, :] * LINE
    prefetch_l2(k_cache_ptr + lines, (toks < end)[:, None])
    prefetch_l2(v_cache_ptr + lines, (toks < end)[:, None])


@jit
def _merge_if_last(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    counter_ptr,
    b,
    kv_head,
    num_kv_heads,
    seq_len,
    split_len,
    num_splits,
    stride_ob,
    stride_oh,
    GROUP: tl.constexpr,
    BLOCK_S: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """The last of a (sequence, kv head)'s written splits to arrive merges its GROUP rows and
    puts the arrival count back to zero (so the counters need no reset between launches)."""
    counter = counter_ptr + b * num_kv_heads + kv_head
    written = tl.maximum(tl.cdiv(seq_len, tl.maximum(split_len, 1)), 1)  # as the early exit
    if arrive(counter) == written - 1:
        splits = tl.arange(0, BLOCK_S)
        dims = tl.arange(0, HEAD_DIM)
        first_row = (b.to(tl.int64) * num_kv_heads + kv_head) * GROUP
        for r in tl.static_range(GROUP):
            o = merge_partials(part_out_ptr, part_lse_ptr, first_row + r, num_splits,
                               splits < written, BLOCK_S, HEAD_DIM)  # fmt: skip
            out_off = b.to(tl.int64) * stride_ob + (kv_head * GROUP + r) * stride_oh + dims
            tl.store(out_ptr + out_off, o.to(out_ptr.dtype.element_ty))
        tl.store(counter, 0)


@jit(do_not_specialize=("num_splits", "min_split"))
def _decode_merge_kernel(
    part_out_ptr,
    part_lse_ptr,
    seq_lens_ptr,
    out_ptr,
    stride_ob,
    stride_oh,
    num_splits,
    min_split,
    BLOCK_S: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    USE_PDL: tl.constexpr,
    EARLY_LOADS: tl.constexpr,  # the length before the wait (as in the split kernel)
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    row = b.to(tl.int64) * tl.num_programs(1) + h
    if not EARLY_LOADS:
        pdl_wait(USE_PDL)
    seq_len = tl.load(seq_lens_ptr + b)
    if EARLY_LOADS:
        pdl_wait(USE_PDL)
    pdl_release(USE_PDL)
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    split_len = tl.maximum(tl.maximum(split_len, min_split), 1)
    written = tl.maximum(tl.cdiv(seq_len, split_len), 1)  # as in the split kernel; split 0 always
    splits = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, HEAD_DIM)
    o = merge_partials(part_out_ptr, part_lse_ptr, row, num_splits, splits < written, BLOCK_S,
                       HEAD_DIM)  # fmt: skip
    out_off = b.to(tl.int64) * stride_ob + h * stride_oh + dims
    tl.store(out_ptr + out_off, o.to(out_ptr.dtype.element_ty))


@jit
def normalize_rows(acc, m_i, l_i):
    """Online-softmax state -> (output rows, log2-sum-exp2 of the scaled scores); a row that saw
    no key gives zeros and lse = -inf."""
    empty = l_i == 0.0
    o = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
    return o, lse


@jit
def merge_partials(
    part_out_ptr,  # fp32 [rows, num_splits, D]: each split's output, normalized over its keys
    part_lse_ptr,  # fp32 [rows, num_splits]: each split's log2-sum-exp2 of scaled scores
    row,
    num_splits,
    split_mask,  # [BLOCK_S]: splits that wrote; an empty split may also write lse = -inf
    BLOCK_S: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """Row ``row``'s output over all its splits, weighted by their share of the softmax."""
    splits = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, HEAD_DIM)
    # .cg: from L2, where the other SMs' stores are (the fused merge reads them in-kernel)
    lse = tl.load(part_lse_ptr + row * num_splits + splits, mask=split_mask, other=float("-inf"),
                  cache_modifier=".cg")  # fmt: skip
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # all splits empty: seq_len 0 -> zeros
    w = tl.exp2(lse - m)  # [BLOCK_S]
    denom = tl.sum(w, 0)
    denom = tl.where(denom == 0.0, 1.0, denom)
    part_ptrs = part_out_ptr + (row * num_splits + splits)[:, None] * HEAD_DIM + dims[None, :]
    o = tl.load(part_ptrs, mask=split_mask[:, None], other=0.0, cache_modifier=".cg")
    return tl.sum(o * w[:, None], 0) / denom


def line_elements(head_dim: int, element_size: int) -> int:
    """Cache elements in one 128-byte line of a head's row (the split kernel's ``LINE``: the
    stride of its L2 requests), at most the row."""
    return min(head_dim, 128 // element_size)


def num_decode_splits(
    batch: int,
    num_kv_heads: int,
    max_context: int,
    num_sms: int,
    programs_per_sm: int = _PROGRAMS_PER_SM,
) -> int:
    """Splits per sequence, from shapes only: about ``programs_per_sm`` programs per SM, but
    no split shorter than ``_MIN_SPLIT_TOKENS`` of the page table's capacity."""
    by_occupancy = programs_per_sm * num_sms // max(1, batch * num_kv_heads)
    by_length = math.ceil(max_context / _MIN_SPLIT_TOKENS)
    return max(1, min(by_occupancy, by_length, _MAX_SPLITS))


def paged_decode_attention(
    q: torch.Tensor,  # [B, Hq, D]
    kv_cache: torch.Tensor,  # [2, num_pages, page_size, Hkv, D]
    block_tables: torch.Tensor,  # int32 [B, max_pages]
    seq_lens: torch.Tensor,  # int32 [B]; 0 = padding row (output zeros)
    scale: float,
    out: torch.Tensor | None = None,  # [B, Hq, D]
    kv_scales: KVScales | None = None,  # needed by an FP8 cache
    *,
    config: DecodeConfig | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    require_triton()
    cfg = config or (FP8_DECODE_CONFIG if is_fp8_kv(kv_cache) else DecodeConfig())
    batch, num_heads, head_dim = q.shape
    page_size, num_kv_heads = kv_cache.shape[2], kv_cache.shape[3]
    assert kv_cache.shape[4] == head_dim and num_heads % num_kv_heads == 0
    assert head_dim == next_pow2(head_dim), "head_dim must be a power of two"
    assert q.stride(-1) == 1 and kv_cache.stride(-1) == 1
    if out is None:
        out = torch.empty_like(q)
    if batch == 0:
        return out
    group = num_heads // num_kv_heads
    splits = cfg.num_splits or num_decode_splits(
        batch, num_kv_heads, block_tables.shape[1] * page_size, sm_count(q.device),
        cfg.programs_per_sm,
    )  # fmt: skip
    min_split = -(-cfg.min_split_tokens // cfg.block_n) * cfg.block_n
    fp8_mode = fp8_operand_mode(cfg.fp8_mode, q.dtype)
    part_out = part_lse = counters = out  # placeholders, unused when splits == 1
    if splits > 1:
        part_out = torch.empty(
            batch, num_heads, splits, head_dim, dtype=torch.float32, device=q.device
        )
        part_lse = torch.empty(batch, num_heads, splits, dtype=torch.float32, device=q.device)
    fused = cfg.fused_merge and 1 < splits <= cfg.fused_merge_max_splits
    if fused:
        counters = _arrival_counters(q.device, batch * num_kv_heads)
    merge_block = max(next_pow2(splits), _MERGE_MIN_BLOCK)
    early = early_loads(pdl)
    k_cache, v_cache = kv_cache[0], kv_cache[1]  # [num_pages, page_size, Hkv, D]
    kernel, grid, extra = _decode_split_kernel, (batch, num_kv_heads, splits), {}
    if fp8_mode == FP8_MMA:
        from kvserve.kernels.fp8_decode_attention import _fp8_decode_split_kernel as kernel

        if cfg.heads_inner:
            grid, extra = (num_kv_heads, batch, splits), {"HEADS_INNER": True}
    kernel[grid](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        part_out,
        part_lse,
        out,
        counters,
        *scale_args(kv_cache, kv_scales),
        scale * math.log2(math.e),
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        splits,
        min_split,
        PAGE_SIZE=page_size,
        GROUP=group,
        BLOCK_H=max(16, next_pow2(group)),
        BLOCK_N=cfg.block_n,
        HEAD_DIM=head_dim,
        DIRECT=splits == 1,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        FP8=is_fp8_kv(kv_cache),
        FP8_MODE=fp8_mode,
        FUSED_MERGE=fused,
        BLOCK_S=merge_block,
        EARLY_LOADS=early,
        LINE=line_elements(head_dim, kv_cache.element_size()),
        **extra,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **launch_options(pdl),
    )
    if splits > 1 and not fused:
        _decode_merge_kernel[(batch, num_heads)](
            part_out,
            part_lse,
            seq_lens,
            out,
            out.stride(0),
            out.stride(1),
            splits,
            min_split,
            BLOCK_S=merge_block,
            BLOCK_N=cfg.block_n,
            HEAD_DIM=head_dim,
            EARLY_LOADS=early,
            num_warps=4,
            **launch_options(pdl),
        )
    return out
