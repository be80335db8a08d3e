"""Paged decode attention (one new query row per sequence), flash-decoding style.

Reference: ``TorchAttentionBackend._decode`` in ``kvserve/layers/attention/torch_backend.py``.

Grid ``(B, Hkv, S)``: one program serves all ``G = Hq / Hkv`` query heads of a kv head (the G rows
padded to >= 16 for ``tl.dot``), so each K/V tile is read once per group. S comes from shapes
only (batch, heads, page-table capacity, SM count) and each program derives its own token range
from ``seq_lens`` on the device, so the launch is CUDA-graph capturable. A batch of two or more
is cut by its tokens (``DecodeConfig.balanced``, ``attention_partials.balanced_item``): its
``B * S`` programs a kv head share one split length, so a 128K-context sequence decoding beside
31 of 1K gets 33 splits instead of 2 (10x faster, decode_mixed_lengths_h200_s48_*); a batch
that fills the GPU with one split a sequence is launched with S = 2 and cut no finer than its
mean length (``_split_plan``), so one of 128K beside 127 of 1K gets 64 instead of 1 (14x,
decode_mixed_lengths_h200_s49_all). Otherwise each sequence is cut into S even splits. A
second kernel merges the splits' partial outputs by their log-sum-exp (or, with
``DecodeConfig.fused_merge``, the split program that arrives last does). With S == 1, or a
sequence's only split in a full batch's cut, the split kernel writes the output directly.

An FP8 cache takes ``fp8_decode_attention``'s kernel (FP8 tensor cores, values dims-major) with
the same grid, splits and merge.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from kvserve.config import env_switch
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
from kvserve.kernels.attention_partials import (
    balanced_splits,
    decode_item,
    load_group_rows,
    merge_partials,
    normalize_rows,
    store_split_output,
)
from kvserve.kernels.fp8_attention_operands import q_terms_setting
from kvserve.kernels.fp8_decode_attention import _fp8_decode_split_kernel
from kvserve.kernels.skinny_gemm import _arrival_counters
from kvserve.kernels.store_kv_cache import (
    KVScales,
    cache_keys,
    is_fp8_kv,
    scale_args,
    tile_tokens,
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
BALANCED_ENV = "KVSERVE_DECODE_BALANCED"
_MERGE_MIN_BLOCK = 32  # merge kernels compiled: splits <= 32 share one, and one for 33-64
# Page tables longer than this split as the longest does (by_length stops at _MAX_SPLITS)
SPLIT_COUNT_TABLE_TOKENS = _MIN_SPLIT_TOKENS * _MAX_SPLITS


@functools.cache
def balanced_splits_enabled() -> bool:
    """``KVSERVE_DECODE_BALANCED``: 1 (the default) cuts a batch's splits by its tokens
    (``DecodeConfig.balanced``); 0 splits every sequence alike, from shapes (for A/B runs)."""
    return env_switch(BALANCED_ENV, default=True)


@dataclass(frozen=True)
class DecodeConfig:
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3
    num_splits: int | None = None  # None: choose from shapes
    # No split shorter than this (rounded up to whole tiles): a sequence shorter than
    # num_splits * min_split_tokens fills fewer splits, and the programs of the rest exit.
    min_split_tokens: int = 0
    programs_per_sm: int = _PROGRAMS_PER_SM  # the split count's occupancy target
    # With 2..fused_merge_max_splits splits, the split program that arrives last merges them
    # (an arrival counter per sequence and kv head) instead of a second kernel.
    fused_merge: bool = False
    fused_merge_max_splits: int = 16
    # Cut a batch of two or more into splits by its tokens (attention_partials.balanced_item):
    # the batch's B * S programs a kv head share its tokens, so a long sequence decoding beside
    # short ones gets the programs its bytes need rather than S; equal lengths split as before.
    # BALANCED_ENV=0 turns it off (for A/B runs of the engine).
    balanced: bool = field(default_factory=balanced_splits_enabled)
    # An FP8 cache: q's e4m3 terms in the scores (fp8_attention_operands: KVSERVE_FP8_Q_TERMS)
    fp8_q_terms: int = field(default_factory=q_terms_setting)


# An FP8 cache (fp8_decode_attention): 64-token tiles (16 KB of keys and values), three stages,
# the fused merge, and splits for 4 programs an SM, the kernel's occupancy (114 registers): a
# grid that is not a whole number of waves leaves SMs idle for its last one (ncu: the earlier
# fp16-operand kernel at 3 programs an SM ran 2.59 waves at 32 x 32K). On the H200, one layer of
# Llama-3-8B heads, graph-timed (fp8_kv_decode_h200_s45_final_2026-12-03.json): 32 x 32K and
# 8 x 128K in 559 / 558 us (90% of copy, 1.72x bf16's speed in the same run), 64 x 1K in 42 us,
# 256 x 1K in 153 us, against the fp16-operand kernel's 694 / 708 / 70 / 236 us
# (fp8_kv_mma_h200_s45_pages_2026-12-03.json). 128-token tiles at 6 an SM read long contexts
# in 541 us but 1K-4K ones slower (56 / 38 / 165 us at 64 x 1K / 8 x 4K / 256 x 1K). With q as
# one e4m3 term (the default since s50; one MMA a tile less), 32 x 32K / 8 x 128K / 64 x 1K /
# 256 x 1K in 527 / 527 / 42 / 150 us against two terms' 554 / 555 / 43 / 158 and bf16's
# 981 / 975 / 70 / 260 in the same run: 1.86x / 1.85x (fp8_kv_decode_h200_s50_q1_2026-12-04).
FP8_DECODE_CONFIG = DecodeConfig(
    block_n=64, num_warps=4, num_stages=3, programs_per_sm=4, fused_merge=True
)
# One program merging more splits than ``fused_merge_max_splits`` (16) is a serial tail: FP8 at
# batch 1 and 1K (64 splits) took 0.77x of bf16's speed fused, 0.94x with the merge kernel. For
# bf16 at batches 1-16 the merge kernel stays: fused merges, fewer filled splits and fixed split
# counts were all slower than the default at 1K-128K (decode_attention_sweep_small_h200,
# ``benchmarks/decode_attention_sweep.py --small``).


@jit(do_not_specialize=("stride_bt", "num_splits", "min_split", "budget"))
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
    budget,  # BALANCED: the batch's splits in all, a kv head
    PAGE_SIZE: tl.constexpr,  # a constant: // and % by it are shifts, not division sequences
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIRECT: tl.constexpr,  # num_splits == 1: write the output, skip the merge
    DOT_PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr,
    FUSED_MERGE: tl.constexpr,  # the split that arrives last merges (no merge kernel)
    BLOCK_S: tl.constexpr,  # FUSED_MERGE: splits merged at once, >= num_splits
    EARLY_LOADS: tl.constexpr,  # lengths, pages and the first tile's L2 fill before the wait
    LINE: tl.constexpr,  # cache elements in a 128-byte line (at most HEAD_DIM)
    BALANCED: tl.constexpr,  # splits by the batch's tokens (attention_partials.balanced_item)
    BLOCK_B: tl.constexpr,  # BALANCED: >= B
    MAX_SPLITS: tl.constexpr,  # BALANCED: at most this many splits a sequence
    MEAN_FLOOR: tl.constexpr,  # BALANCED: no split shorter than the mean length
):
    if not EARLY_LOADS:
        pdl_wait(USE_PDL)
    kv_head = tl.program_id(1)
    num_kv_heads = tl.num_programs(1)
    b, split, seq_len, split_len, start, end, row0, head_stride, split_stride, alone, past = (
        decode_item(
            seq_lens_ptr, tl.program_id(0), tl.program_id(2), num_splits, min_split, budget,
            GROUP, BALANCED, MAX_SPLITS, MEAN_FLOOR, BLOCK_B, BLOCK_N, False,
        )
    )  # fmt: skip
    if past:
        return  # past the batch's splits
    if split > 0 and start >= end:
        return  # past the sequence's end: the merge reads only the splits before this one
    table = block_tables_ptr + b.to(tl.int64) * stride_bt
    if EARLY_LOADS:
        _first_tile_to_l2(
            k_cache_ptr, v_cache_ptr, table, start, end, kv_head, stride_cache_page,
            stride_cache_tok, stride_cache_head, PAGE_SIZE, BLOCK_N, HEAD_DIM, LINE,
        )  # fmt: skip
        pdl_wait(USE_PDL)

    q, heads, row_mask = load_group_rows(
        q_ptr, b, kv_head, stride_qb, stride_qh, GROUP, BLOCK_H, HEAD_DIM
    )
    dims = tl.arange(0, HEAD_DIM)

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
    store_split_output(
        o, lse, part_out_ptr, part_lse_ptr, out_ptr, counter_ptr, b, kv_head, num_kv_heads,
        heads, row_mask, seq_len, split, split_len, row0, head_stride, split_stride, alone,
        stride_ob, stride_oh, GROUP, HEAD_DIM, DIRECT, FUSED_MERGE, BLOCK_S,
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


@jit(do_not_specialize=("num_splits", "min_split", "budget"))
def _decode_merge_kernel(
    part_out_ptr,
    part_lse_ptr,
    seq_lens_ptr,
    out_ptr,
    stride_ob,
    stride_oh,
    num_splits,
    min_split,
    budget,
    BLOCK_S: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    USE_PDL: tl.constexpr,
    EARLY_LOADS: tl.constexpr,  # the lengths before the wait (as in the split kernel)
    BALANCED: tl.constexpr,
    BLOCK_B: tl.constexpr,
    MAX_SPLITS: tl.constexpr,
    MEAN_FLOOR: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    num_heads = tl.num_programs(1)
    if not EARLY_LOADS:
        pdl_wait(USE_PDL)
    if BALANCED:
        batch = tl.num_programs(0)
        _, counts, _ = balanced_splits(
            seq_lens_ptr, batch, budget, min_split, MAX_SPLITS, MEAN_FLOOR, BLOCK_B, BLOCK_N
        )
        here = tl.arange(0, BLOCK_B) == b
        written = tl.sum(tl.where(here, counts, 0), 0)
        row = tl.sum(tl.where(here, tl.cumsum(counts, 0) - counts, 0), 0) * num_heads + h
        split_stride = num_heads
    else:
        seq_len = tl.load(seq_lens_ptr + b)
        split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
        split_len = tl.maximum(tl.maximum(split_len, min_split), 1)
        written = tl.maximum(tl.cdiv(seq_len, split_len), 1)  # as the split kernel; split 0 always
        row = (b.to(tl.int64) * num_heads + h) * num_splits
        split_stride = 1
    if EARLY_LOADS:
        pdl_wait(USE_PDL)
    pdl_release(USE_PDL)
    dims = tl.arange(0, HEAD_DIM)
    o = merge_partials(part_out_ptr, part_lse_ptr, row, split_stride, written, BLOCK_S, HEAD_DIM)
    out_off = b.to(tl.int64) * stride_ob + h * stride_oh + dims
    tl.store(out_ptr + out_off, o.to(out_ptr.dtype.element_ty))


def line_elements(head_dim: int, element_size: int) -> int:
    """Cache elements in one 128-byte line of a head's row (the split kernel's ``LINE``: the
    stride of its L2 requests), at most the row."""
    return min(head_dim, 128 // element_size)


def _dot_precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


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


@dataclass(frozen=True)
class SplitPlan:
    splits: int  # the grid's S: B * S programs a kv head
    balanced: bool  # cut by the batch's tokens (attention_partials.balanced_item)
    budget: int  # balanced: at most this many splits in all, a kv head
    mean_floor: bool  # balanced: no split shorter than the batch's mean length
    fused_merge: bool


def _split_plan(
    cfg: DecodeConfig, batch: int, num_kv_heads: int, table_tokens: int, sms: int
) -> SplitPlan:
    """S from shapes (or the config), and how the batch is cut. A batch that fills the GPU with
    one split a sequence (S == 1 from occupancy, with tables longer than a split) gets a second
    split a sequence in the grid when balanced, at most one more program a head for each the
    GPU holds (the budget), and the mean-length floor: equal lengths stay whole and write their
    outputs directly, a sequence longer than the mean is cut, and its merge is fused (no merge
    kernel launch)."""
    splits = cfg.num_splits or num_decode_splits(
        batch, num_kv_heads, table_tokens, sms, cfg.programs_per_sm
    )
    can_balance = cfg.balanced and batch > 1
    if can_balance and splits == 1 and not cfg.num_splits and table_tokens > _MIN_SPLIT_TOKENS:
        held = cfg.programs_per_sm * sms // num_kv_heads
        return SplitPlan(2, True, min(2 * batch, batch + held), True, True)
    fused = cfg.fused_merge and 1 < splits <= cfg.fused_merge_max_splits
    return SplitPlan(splits, can_balance and splits > 1, batch * splits, False, fused)


def _partials(
    plan: SplitPlan, out: torch.Tensor, num_kv_heads: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The splits' partial outputs and log-sum-exps (fp32) and, with the fused merge, the
    arrival counters; ``out`` stands in for what the plan does not use."""
    batch, num_heads, head_dim = out.shape
    part_out = part_lse = counters = out
    if plan.splits > 1:
        shape = (batch, num_heads, plan.splits)
        part_out = torch.empty(*shape, head_dim, dtype=torch.float32, device=out.device)
        part_lse = torch.empty(*shape, dtype=torch.float32, device=out.device)
    if plan.fused_merge:
        counters = _arrival_counters(out.device, batch * num_kv_heads)
    return part_out, part_lse, counters


def _plan_args(plan: SplitPlan, batch: int) -> dict[str, int | bool]:
    """The split and merge kernels' arguments for how the batch is cut."""
    # the merge reads BLOCK_S splits at a time: all of them at once when cut evenly, in steps
    # of 32 when balanced (one sequence may have up to _MAX_SPLITS, most have a few)
    merge_block = max(next_pow2(plan.splits), _MERGE_MIN_BLOCK)
    # BLOCK_B below 32 took the FP8 kernel from 117-124 to 138-146 registers (sm_90, ptxas):
    # past 128, three programs an SM instead of four
    return {
        "BALANCED": plan.balanced,
        "BLOCK_B": max(next_pow2(batch), 32) if plan.balanced else 32,  # one compile unbalanced
        "MAX_SPLITS": _MAX_SPLITS,
        "MEAN_FLOOR": plan.mean_floor,
        "budget": plan.budget,
        "BLOCK_S": _MERGE_MIN_BLOCK if plan.balanced else merge_block,
    }


def default_decode_config(kv_cache: torch.Tensor) -> DecodeConfig:
    return FP8_DECODE_CONFIG if is_fp8_kv(kv_cache) else DecodeConfig()


def launch_variant(
    cfg: DecodeConfig, batch: int, num_kv_heads: int, table_tokens: int, sms: int
) -> tuple:
    """What a launch compiles, from shapes alone: the constexprs its split kernel and merge
    kernel (if any) take beyond the model's own. Two launches of one variant share their
    kernels, so a warm-up that runs every variant leaves no compile to a request."""
    plan = _split_plan(cfg, batch, num_kv_heads, table_tokens, sms)
    args = {k: v for k, v in _plan_args(plan, batch).items() if k != "budget"}
    return plan.splits == 1, plan.fused_merge, tuple(sorted(args.items()))


def _split_kernel(
    q: torch.Tensor, kv_cache: torch.Tensor, kv_scales: KVScales | None, cfg: DecodeConfig
) -> tuple[Any, dict[str, Any]]:
    """The split kernel for the cache's dtype, with its own arguments: the bf16 kernel's dot
    precision, or the FP8 kernel's scales and q's terms."""
    if is_fp8_kv(kv_cache):
        k_scale, v_scale = scale_args(kv_cache, kv_scales)
        own = {"k_scale_ptr": k_scale, "v_scale_ptr": v_scale, "Q_TERMS": cfg.fp8_q_terms}
        return _fp8_decode_split_kernel, own
    return _decode_split_kernel, {"DOT_PRECISION": _dot_precision(q.dtype)}


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
    cfg = config or default_decode_config(kv_cache)
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
    table_tokens = block_tables.shape[1] * page_size
    plan = _split_plan(cfg, batch, num_kv_heads, table_tokens, sm_count(q.device))
    splits = plan.splits
    block_n = tile_tokens(cfg.block_n, kv_cache)
    min_split = -(-cfg.min_split_tokens // block_n) * block_n
    part_out, part_lse, counters = _partials(plan, out, num_kv_heads)
    plan_args = _plan_args(plan, batch)
    early = early_loads(pdl)
    k_cache, v_cache = cache_keys(kv_cache), kv_cache[1]  # keys [pages, page, Hkv, D]
    kernel, own_args = _split_kernel(q, kv_cache, kv_scales, cfg)
    kernel[(batch, num_kv_heads, splits)](
        q_ptr=q,
        k_cache_ptr=k_cache,
        v_cache_ptr=v_cache,
        block_tables_ptr=block_tables,
        seq_lens_ptr=seq_lens,
        part_out_ptr=part_out,
        part_lse_ptr=part_lse,
        out_ptr=out,
        counter_ptr=counters,
        scale_log2=scale * math.log2(math.e),
        stride_qb=q.stride(0),
        stride_qh=q.stride(1),
        stride_cache_page=k_cache.stride(0),
        stride_cache_tok=k_cache.stride(1),
        stride_cache_head=k_cache.stride(2),
        stride_bt=block_tables.stride(0),
        stride_ob=out.stride(0),
        stride_oh=out.stride(1),
        num_splits=splits,
        min_split=min_split,
        PAGE_SIZE=page_size,
        GROUP=group,
        BLOCK_H=max(16, next_pow2(group)),
        BLOCK_N=block_n,
        HEAD_DIM=head_dim,
        DIRECT=splits == 1,
        FUSED_MERGE=plan.fused_merge,
        EARLY_LOADS=early,
        LINE=line_elements(head_dim, kv_cache.element_size()),
        **plan_args,
        **own_args,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **launch_options(pdl),
    )
    if splits > 1 and not plan.fused_merge:
        _decode_merge_kernel[(batch, num_heads)](
            part_out, part_lse, seq_lens, out, out.stride(0), out.stride(1), splits, min_split,
            BLOCK_N=block_n, HEAD_DIM=head_dim, EARLY_LOADS=early, **plan_args, num_warps=4,
            **launch_options(pdl),
        )  # fmt: skip
    return out
