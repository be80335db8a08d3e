"""Paged prefill attention: variable-length, causal, over cached prefix + new tokens, one launch.

Reference: ``TorchAttentionBackend._prefill_one`` in ``kvserve/layers/attention/torch_backend.py``.

The new tokens are already in the cache (``store_kv_cache`` runs first), so every key/value is
read through the page table. Row j of sequence i sits at position ``ctx_i + j`` with
``ctx_i = seq_lens[i] - qlen_i``; the prefix may end mid-page.

Grid ``(ceil(max_query_len / BLOCK_M), B, Hq)``; blocks past a sequence's own query length exit.
For a block of rows starting at ``start_m``, keys split into two ranges:

    keys: | 0 ............ lo | lo ......... hi |
          | every row sees it | causal mask    |    lo = (ctx + start_m) rounded down to BLOCK_N
                                                     hi = min(ctx + start_m + BLOCK_M, seq_len)

With S key splits (a short chunk behind a long context: see ``num_prefill_kv_splits``) the
grid's first axis is ``row blocks x S``; split s of a row block attends to its run of the
``[0, lo)`` tiles (the last split also to ``[lo, hi)``) and writes a partial output and its
log-sum-exp, which ``_prefill_merge_kernel`` combines.

Over an FP8 cache both products run on FP8 tensor cores (``_attend_fp8_tile``: q as one or two
e4m3 rows, p in e4m3, as the FP8 decode kernel; values are stored dims-major, so a tile of them
is already the K-major operand FP8 MMAs need). Widening the tiles to fp16 operands instead took
1.880 / 1.067 / 3.419 ms on the H200 where this takes 1.500 / 0.877 / 2.962 (8K prompt, 2K
chunks at 10K / 32K; fp8_kv_prefill_h200_s46_q1). The key scale is folded into the softmax scale
and the value scale applied once to each output row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from kvserve.kernels._triton import jit, next_pow2, require_triton, sm_count, tl
from kvserve.kernels.attention_partials import merge_partials, normalize_rows
from kvserve.kernels.fp8_attention_operands import P_LOG2, e4m3_query_rows, q_terms_setting
from kvserve.kernels.store_kv_cache import (
    KVScales,
    cache_keys,
    is_fp8_kv,
    load_value_tile_t,
    scale_args,
    tile_pages,
    tile_tokens,
)


@dataclass(frozen=True)
class PrefillConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    # Rescale the accumulator only when some row's running max grows by more than 8 (log2
    # units): one compare per tile instead of a multiply over [BLOCK_M, D] and the exp2s.
    lazy_rescale: bool = False
    # Over an FP8 cache: q as one e4m3 row (its own scale), or as hi + lo rows (the setting's
    # default: one). On the H200 one term took 1.500 / 0.877 / 2.962 ms where two took
    # 1.773 / 1.030 / 3.463 (8K prompt, 2K chunks at 10K / 32K) for 0.0035 RMS from exact
    # attention against 0.0028, where rounding the cache alone costs 0.0026, outputs of RMS
    # 0.051 (fp8_kv_prefill_h200_s46_q1).
    fp8_q_terms: int = field(default_factory=q_terms_setting)
    kv_splits: int = 0  # programs per row block, each over a run of the keys; 0: from shapes


# A short chunk behind a long context is one row block per head: 32 programs for a 256-token
# chunk of an 8B model, on 132 SMs. Splitting its keys fills the GPU; the splits' partials
# (fp32) are merged by _prefill_merge_kernel. One program of the default tile runs per SM, so
# the splits fill one wave and never start a second, partial one: on the H200 a 256-token
# chunk at 128K took 5.49 ms unsplit, 1.55 / 1.54 ms with 4 / 8 splits (128 / 256 programs)
# and 2.01 ms with 9 (288: a third wave); 512 tokens: 5.73 unsplit, 3.01 / 2.98 with 2 / 4;
# 1024 tokens (128 programs): 5.55 unsplit, no split faster
# (long_context_sweep_chunks_h200_2026-12-01.json). No split reads fewer than
# _SPLIT_MIN_KEYS keys, and the partials stay under _SPLIT_WORKSPACE_BYTES: far below a
# largest step's activations, which the KV pool's sizing measured (a split step has few rows).
_SPLIT_MIN_KEYS = 2048
_SPLIT_WORKSPACE_BYTES = 64 << 20
_MAX_KV_SPLITS = 16  # also the merge's block: one compile for every count
# The shortest context at which a chunk can be split: warm-up compiles the split kernels there.
SPLIT_MIN_CONTEXT = 2 * _SPLIT_MIN_KEYS


def num_prefill_kv_splits(
    programs: int, max_seq_len: int, num_tokens: int, num_heads: int, head_dim: int, num_sms: int
) -> int:
    """Key splits per row block, from host shapes only: as many as one wave of one program
    per SM holds (none once the row blocks alone are more than half the SMs)."""
    by_occupancy = num_sms // max(1, programs)
    by_length = max_seq_len // _SPLIT_MIN_KEYS
    by_memory = _SPLIT_WORKSPACE_BYTES // max(1, num_tokens * num_heads * (head_dim + 1) * 4)
    return max(1, min(by_occupancy, by_length, by_memory, _MAX_KV_SPLITS))


def default_prefill_config(
    head_dim: int, dtype: torch.dtype, fp8_cache: bool = False
) -> PrefillConfig:
    if fp8_cache:
        return _default_fp8_config(head_dim, dtype)
    if dtype == torch.float32:
        return PrefillConfig(block_m=32, block_n=32, num_warps=4, num_stages=2)
    if head_dim > 128:  # untuned: keep the [BLOCK_M, D] accumulator in registers
        return PrefillConfig(block_m=64, block_n=32, num_warps=4, num_stages=2)
    # H200 sweeps, Llama-3-8B heads (benchmarks/kernels_h200.py --sweep): on 2026-11-29
    # 256x64 / 8 warps / 3 stages led at 4K and 16K; on 2026-12-05 (two sweeps, one machine)
    # 128x128 / 8 warps / 3 stages led at 1K / 4K / 16K with 154 / 334 / 426 against 146 / 299 /
    # 417 TFLOP/s, and spills nothing (the 256-row tile spilled 136 bytes a thread under
    # Triton 3.6). D=64 was not swept.
    if head_dim == 128:
        return PrefillConfig(block_m=128, block_n=128, num_warps=8, num_stages=3)
    return PrefillConfig(block_m=128, block_n=64, num_warps=4, num_stages=3)


def _default_fp8_config(head_dim: int, dtype: torch.dtype) -> PrefillConfig:
    """Over an FP8 cache, on FP8 tensor cores: 128 x 128 tiles (at 128-dim heads the bf16
    cache's tile too; a 256-row tile spilled here, 360 bytes of stack on sm_90 with q as one
    e4m3 term, 448 with two: ``kernel_spills`` ``compile_prefill``). Tiles timed:
    fp8_kv_prefill_h200_s46."""
    if dtype == torch.float32 or head_dim > 128:
        return default_prefill_config(head_dim, dtype)
    return PrefillConfig(128, 128, 8 if head_dim == 128 else 4, 3)


@jit
def _attend_tile(
    q,
    acc,
    m_i,
    l_i,
    k_cache_ptr,
    v_cache_ptr,
    table,
    n0,
    q_pos,
    hi,
    kv_head,
    stride_cache_page,
    stride_cache_tok,
    stride_cache_head,
    scale_log2,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    MASKED: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    LAZY_RESCALE: tl.constexpr,
):
    toks = n0 + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    if MASKED:
        tok_mask = toks < hi
        page = tl.load(table + toks // PAGE_SIZE, mask=tok_mask, other=0).to(tl.int64)
    else:
        page = tl.load(table + toks // PAGE_SIZE).to(tl.int64)
    kv_off = page * stride_cache_page + (toks % PAGE_SIZE) * stride_cache_tok
    kv_off = kv_off + kv_head * stride_cache_head
    kv_ptrs = kv_off[:, None] + dims[None, :]  # [BLOCK_N, D]
    if MASKED:
        k = tl.load(k_cache_ptr + kv_ptrs, mask=tok_mask[:, None], other=0.0)
    else:
        k = tl.load(k_cache_ptr + kv_ptrs)
    if MASKED:
        v = tl.load(v_cache_ptr + kv_ptrs, mask=tok_mask[:, None], other=0.0)
    else:
        v = tl.load(v_cache_ptr + kv_ptrs)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # [BLOCK_M, N], unscaled
    if MASKED:
        visible = (toks[None, :] <= q_pos[:, None]) & tok_mask[None, :]
        s = tl.where(visible, s, float("-inf"))
    # Every row sees key 0 in the first tile it visits, so m_new is finite from then on.
    # The scale is applied inside the exponent (one FMA per score); m is kept scaled.
    m_new = tl.maximum(m_i, tl.max(s, 1) * scale_log2)
    if LAZY_RESCALE:
        # Scores stay relative to a stale max while no row's max grew by more than 8: p is
        # then at most 2^8, exact enough in bf16 and in the fp32 sums. The first tile always
        # rescales (m_i is -inf).
        if tl.max((m_new > m_i + 8.0).to(tl.int32), 0) > 0:
            alpha = tl.exp2(m_i - m_new)
            acc = acc * alpha[:, None]
            l_i = l_i * alpha
            m_i = m_new
        p = tl.exp2(s * scale_log2 - m_i[:, None])
        l_i = l_i + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc=acc, input_precision=DOT_PRECISION)
    else:
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s * scale_log2 - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@jit
def _attend_fp8_tile(
    q_hi,
    q_lo,
    hi_scale,
    lo_scale,
    acc,
    m_i,
    l_i,
    k_cache_ptr,
    v_cache_ptr,
    table,
    n0,
    q_pos,
    hi,
    kv_head,
    stride_cache_page,
    stride_cache_tok,
    stride_cache_head,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    MASKED: tl.constexpr,
    Q_TERMS: tl.constexpr,
):
    """``_attend_tile`` on FP8 tensor cores: q as e4m3 rows (hi, and lo with Q_TERMS = 2) whose
    scales carry the softmax scale (m is kept scaled), p rounded to e4m3 times 2**P_LOG2 (taken
    in the exponent, so l sums the scaled p and acc / l needs no correction); one page-id load a
    page serves both keys and values."""
    toks = n0 + tl.arange(0, BLOCK_N)
    base, page_ok = tile_pages(table, n0, hi, stride_cache_page, PAGE_SIZE, BLOCK_N)
    slots = tl.arange(0, PAGE_SIZE)
    k_rows = base[:, None] + slots[None, :] * stride_cache_tok + kv_head * stride_cache_head
    k_ptrs = tl.multiple_of(tl.reshape(k_rows, (BLOCK_N,)), 16)[:, None] + tl.arange(0, HEAD_DIM)
    if MASKED:
        k = tl.load(k_cache_ptr + k_ptrs, mask=(toks < hi)[:, None], other=0.0)
    else:
        k = tl.load(k_cache_ptr + k_ptrs)
    v_t = load_value_tile_t(v_cache_ptr, base, kv_head, page_ok, PAGE_SIZE, HEAD_DIM)  # [D, N]
    k_t = tl.trans(k)
    s = tl.dot(q_hi, k_t) * hi_scale[:, None]
    if Q_TERMS == 2:
        s += tl.dot(q_lo, k_t) * lo_scale[:, None]
    if MASKED:
        s = tl.where((toks[None, :] <= q_pos[:, None]) & (toks < hi)[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: see _attend_tile
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - (m_new - P_LOG2)[:, None])  # p * 2**P_LOG2, in [0, 256]
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(tl.float8e4nv), tl.trans(v_t))
    return acc, m_new, l_i


# kv_splits unspecialized: one compile serves every split count (the engine's warm-up runs one)
# seq_lens and block_tables are a mixed step's from its first prefill sequence on: aligned or
# not by where the decodes end
@jit(
    do_not_specialize=("stride_bt", "kv_splits"),
    do_not_specialize_on_alignment=("seq_lens_ptr", "block_tables_ptr"),
)
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    block_tables_ptr,
    k_scale_ptr,
    v_scale_ptr,
    scale_log2,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_cache_page,
    stride_cache_tok,
    stride_cache_head,
    stride_bt,
    kv_splits,
    PAGE_SIZE: tl.constexpr,  # a constant: // and % by it are shifts, not division sequences
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    LAZY_RESCALE: tl.constexpr,
    FP8: tl.constexpr,  # an FP8 cache: both products on FP8 tensor cores
    Q_TERMS: tl.constexpr,  # FP8: q's e4m3 terms
    SPLIT: tl.constexpr,  # kv_splits > 1: write partials for _prefill_merge_kernel
):
    # Last row blocks (the most keys) first, so the long programs do not form the tail.
    split = tl.program_id(0) % kv_splits
    m_block = tl.num_programs(0) // kv_splits - 1 - tl.program_id(0) // kv_splits
    b = tl.program_id(1)
    head = tl.program_id(2)
    q_start = tl.load(query_start_loc_ptr + b)
    q_len = tl.load(query_start_loc_ptr + b + 1) - q_start
    start_m = m_block * BLOCK_M
    if start_m >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + b)
    ctx_len = seq_len - q_len

    rows = start_m + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    row_mask = rows < q_len
    q_rows = (q_start + rows).to(tl.int64)
    q_ptrs = q_ptr + q_rows[:, None] * stride_qt + head * stride_qh + dims[None, :]
    q = tl.load(q_ptrs, mask=row_mask[:, None], other=0.0)  # [BLOCK_M, D]
    q_pos = ctx_len + rows
    if FP8:
        scale_log2 = scale_log2 * tl.load(k_scale_ptr)
        q, q_lo, hi_scale, lo_scale = e4m3_query_rows(q.to(tl.float32), scale_log2, Q_TERMS)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    table = block_tables_ptr + b.to(tl.int64) * stride_bt
    kv_head = head // GROUP
    lo = (ctx_len + start_m) // BLOCK_N * BLOCK_N
    hi = tl.minimum(ctx_len + start_m + BLOCK_M, seq_len)
    full_lo, full_hi = 0, lo
    if SPLIT:
        # Split s takes its run of the unmasked tiles; the last split also the masked ones, so
        # every row's last split sees at least key lo.
        tiles = lo // BLOCK_N
        per_split = tl.cdiv(tiles, kv_splits)
        full_lo = tl.minimum(split * per_split, tiles) * BLOCK_N
        full_hi = tl.minimum(split * per_split + per_split, tiles) * BLOCK_N
        hi = tl.where(split == kv_splits - 1, hi, lo)
    for n0 in range(full_lo, full_hi, BLOCK_N):
        if FP8:
            acc, m_i, l_i = _attend_fp8_tile(
                q, q_lo, hi_scale, lo_scale, acc, m_i, l_i, k_cache_ptr, v_cache_ptr, table, n0,
                q_pos, hi, kv_head, stride_cache_page, stride_cache_tok, stride_cache_head,
                PAGE_SIZE, BLOCK_N, HEAD_DIM, False, Q_TERMS,
            )  # fmt: skip
        else:
            acc, m_i, l_i = _attend_tile(
                q, acc, m_i, l_i, k_cache_ptr, v_cache_ptr, table, n0, q_pos, hi, kv_head,
                stride_cache_page, stride_cache_tok, stride_cache_head, scale_log2, PAGE_SIZE,
                BLOCK_N, HEAD_DIM, False, DOT_PRECISION, LAZY_RESCALE,
            )  # fmt: skip
    for n0 in range(lo, hi, BLOCK_N):
        if FP8:
            acc, m_i, l_i = _attend_fp8_tile(
                q, q_lo, hi_scale, lo_scale, acc, m_i, l_i, k_cache_ptr, v_cache_ptr, table, n0,
                q_pos, hi, kv_head, stride_cache_page, stride_cache_tok, stride_cache_head,
                PAGE_SIZE, BLOCK_N, HEAD_DIM, True, Q_TERMS,
            )  # fmt: skip
        else:
            acc, m_i, l_i = _attend_tile(
                q, acc, m_i, l_i, k_cache_ptr, v_cache_ptr, table, n0, q_pos, hi, kv_head,
                stride_cache_page, stride_cache_tok, stride_cache_head, scale_log2, PAGE_SIZE,
                BLOCK_N, HEAD_DIM, True, DOT_PRECISION, LAZY_RESCALE,
            )  # fmt: skip

    if FP8:
        m_i -= P_LOG2  # l summed p * 2**P_LOG2: the log-sum-exp stays the scores'
    o, lse = normalize_rows(acc, m_i, l_i)
    if FP8:
        o = o * tl.load(v_scale_ptr)
    if SPLIT:
        # part_out: [T, Hq, S, D] fp32, part_lse: [T, Hq, S] (log2 units)
        part_row = (q_rows * tl.num_programs(2) + head) * kv_splits + split
        tl.store(part_lse_ptr + part_row, lse, mask=row_mask)
        part_ptrs = part_out_ptr + part_row[:, None] * HEAD_DIM + dims[None, :]
        tl.store(part_ptrs, o, mask=row_mask[:, None])
    else:
        out_ptrs = out_ptr + q_rows[:, None] * stride_ot + head * stride_oh + dims[None, :]
        tl.store(out_ptrs, o.to(out_ptr.dtype.element_ty), mask=row_mask[:, None])


@jit(do_not_specialize=("kv_splits",))
def _prefill_merge_kernel(
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    stride_ot,
    stride_oh,
    kv_splits,
    BLOCK_S: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    t = tl.program_id(0)
    head = tl.program_id(1)
    row = t.to(tl.int64) * tl.num_programs(1) + head
    o = merge_partials(part_out_ptr, part_lse_ptr, row * kv_splits, 1, kv_splits, BLOCK_S, HEAD_DIM)
    out_off = t.to(tl.int64) * stride_ot + head * stride_oh + tl.arange(0, HEAD_DIM)
    tl.store(out_ptr + out_off, o.to(out_ptr.dtype.element_ty))


def paged_prefill_attention(
    q: torch.Tensor,  # [T, Hq, D]
    kv_cache: torch.Tensor,  # [2, num_pages, page_size, Hkv, D]
    query_start_loc: torch.Tensor,  # int32 [B + 1]
    seq_lens: torch.Tensor,  # int32 [B]
    block_tables: torch.Tensor,  # int32 [B, max_pages]
    max_query_len: int,
    scale: float,
    kv_scales: KVScales | None = None,  # needed by an FP8 cache
    *,
    config: PrefillConfig | None = None,
    max_seq_len: int | None = None,  # host copy of max(seq_lens); None: the table's capacity
) -> torch.Tensor:  # [T, Hq, D]
    require_triton()
    num_tokens, num_heads, head_dim = q.shape
    page_size, num_kv_heads = kv_cache.shape[2], kv_cache.shape[3]
    assert kv_cache.shape[4] == head_dim and num_heads % num_kv_heads == 0
    assert head_dim == next_pow2(head_dim), "head_dim must be a power of two"
    assert q.stride(-1) == 1 and kv_cache.stride(-1) == 1
    fp8 = is_fp8_kv(kv_cache)
    cfg = config or default_prefill_config(head_dim, q.dtype, fp8)
    assert not (fp8 and cfg.lazy_rescale), "p in e4m3 needs p <= 1"
    block_n = tile_tokens(cfg.block_n, kv_cache)
    out = torch.empty_like(q)
    batch = seq_lens.shape[0]
    if num_tokens == 0 or batch == 0:
        return out
    k_cache, v_cache = cache_keys(kv_cache), kv_cache[1]  # keys [pages, page, Hkv, D]
    row_blocks = triton_cdiv(max_query_len, cfg.block_m)
    splits = cfg.kv_splits or num_prefill_kv_splits(
        row_blocks * batch * num_heads,
        max_seq_len if max_seq_len is not None else block_tables.shape[1] * page_size,
        num_tokens, num_heads, head_dim, sm_count(q.device),
    )  # fmt: skip
    part_out = part_lse = out  # placeholders, unused without splits
    if splits > 1:
        part_out = torch.empty(
            num_tokens, num_heads, splits, head_dim, dtype=torch.float32, device=q.device
        )
        part_lse = torch.empty(num_tokens, num_heads, splits, dtype=torch.float32, device=q.device)
    _prefill_kernel[(row_blocks * splits, batch, num_heads)](
        q,
        k_cache,
        v_cache,
        out,
        part_out,
        part_lse,
        query_start_loc,
        seq_lens,
        block_tables,
        *scale_args(kv_cache, kv_scales),
        scale * math.log2(math.e),
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        splits,
        PAGE_SIZE=page_size,
        GROUP=num_heads // num_kv_heads,
        BLOCK_M=cfg.block_m,
        BLOCK_N=block_n,
        HEAD_DIM=head_dim,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        LAZY_RESCALE=cfg.lazy_rescale,
        FP8=fp8,
        Q_TERMS=cfg.fp8_q_terms,
        SPLIT=splits > 1,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    if splits > 1:
        _prefill_merge_kernel[(num_tokens, num_heads)](
            part_out, part_lse, out, out.stride(0), out.stride(1), splits,
            BLOCK_S=_MAX_KV_SPLITS, HEAD_DIM=head_dim, num_warps=4,
        )  # fmt: skip
    return out


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
