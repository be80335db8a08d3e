"""Paged decode attention over an FP8 (e4m3) cache on FP8 tensor cores (Hopper's wgmma).

Both products run on FP8 tensor cores with the tile on the wgmma's M side (swap-AB: a decode
step has a GQA group's few query rows, and wgmma needs 64):

    S^T [N, G] = K [N, D] @ Q8^T [D, G]        (K-major: a key's D values are contiguous)
    O^T [D, G] += V^T [D, N] @ P8^T [N, G]     (K-major because values are stored dims-major)

The cache stores values dims-major (``store_kv_cache``): a page's run of one head is
[D, page_size], so a tile of values is read a page at a time in memory order and is already the
K-major operand. q is one e4m3 row (or two, hi and remainder, with ``KVSERVE_FP8_Q_TERMS=2``)
and p is rounded to e4m3 times ``P_SCALE`` (``fp8_attention_operands``). On the H200 this
kernel's output is 0.0034 RMS from fp32 attention over the cache's own values with one term
(0.0015 with two), for outputs of RMS 0.09, where rounding the values into the cache alone
costs 0.0043 (fp8_kv_decode_h200_s50_q1_2026-12-04.json).

The fp16-operand kernel this replaces read the values' [N, D] operand back from shared memory
a byte at a time and widened every tile; it read long contexts at 72% of copy bandwidth, this
one at 88% (``decode_attention.FP8_DECODE_CONFIG``).

Launched by ``decode_attention.paged_decode_attention`` with the bf16 kernel's grid, splits and
merge.
"""

from __future__ import annotations

from kvserve.kernels._triton import jit, pdl_release, pdl_wait, prefetch_l2, tl
from kvserve.kernels.attention_partials import (
    decode_item,
    load_group_rows,
    normalize_rows,
    store_split_output,
)
from kvserve.kernels.fp8_attention_operands import P_SCALE, e4m3_query_rows
from kvserve.kernels.store_kv_cache import load_value_tile_t, tile_pages


@jit(do_not_specialize=("stride_bt", "num_splits", "min_split", "budget"))
def _fp8_decode_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,  # values dims-major: a page's run of a head is [HEAD_DIM, PAGE_SIZE]
    block_tables_ptr,
    seq_lens_ptr,
    part_out_ptr,
    part_lse_ptr,
    out_ptr,
    counter_ptr,
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
    budget,  # BALANCED: the batch's splits in all, a kv head
    PAGE_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,  # a multiple of PAGE_SIZE
    HEAD_DIM: tl.constexpr,
    DIRECT: tl.constexpr,
    USE_PDL: tl.constexpr,
    FUSED_MERGE: tl.constexpr,
    BLOCK_S: tl.constexpr,
    EARLY_LOADS: tl.constexpr,
    LINE: tl.constexpr,  # cache bytes in a 128-byte line (at most HEAD_DIM)
    BALANCED: tl.constexpr,
    BLOCK_B: tl.constexpr,
    MAX_SPLITS: tl.constexpr,
    MEAN_FLOOR: tl.constexpr,
    Q_TERMS: tl.constexpr,  # q's e4m3 terms (fp8_attention_operands)
):
    if not EARLY_LOADS:
        pdl_wait(USE_PDL)
    kv_head = tl.program_id(1)
    num_kv_heads = tl.num_programs(1)
    # start a multiple of BLOCK_N that the compiler sees, so of PAGE_SIZE: a tile's pages are whole
    b, split, seq_len, split_len, start, end, row0, head_stride, split_stride, alone, past = (
        decode_item(
            seq_lens_ptr, tl.program_id(0), tl.program_id(2), num_splits, min_split, budget,
            GROUP, BALANCED, MAX_SPLITS, MEAN_FLOOR, BLOCK_B, BLOCK_N, True,
        )
    )  # fmt: skip
    if past:
        return
    if split > 0 and start >= end:
        return
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
    score_scale = scale_log2 * tl.load(k_scale_ptr)
    q_hi, q_lo, hi_scale, lo_scale = e4m3_query_rows(q.to(tl.float32), score_scale, Q_TERMS)
    q_hi_t, q_lo_t = tl.trans(q_hi), tl.trans(q_lo)  # [D, BLOCK_H]

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_acc = tl.zeros([BLOCK_N, BLOCK_H], tl.float32)  # summed over tokens once, at the end
    acc = tl.zeros([HEAD_DIM, BLOCK_H], tl.float32)  # O^T
    slots = tl.arange(0, PAGE_SIZE)
    for n0 in range(start, end, BLOCK_N):
        toks = n0 + tl.arange(0, BLOCK_N)
        tok_mask = toks < end
        base, page_ok = tile_pages(table, n0, end, stride_cache_page, PAGE_SIZE, BLOCK_N)
        k_rows = base[:, None] + slots[None, :] * stride_cache_tok + kv_head * stride_cache_head
        k_rows = tl.multiple_of(tl.reshape(k_rows, (BLOCK_N,)), 16)
        k = tl.load(k_cache_ptr + k_rows[:, None] + dims[None, :], mask=tok_mask[:, None],
                    other=0.0)  # fmt: skip
        v_t = load_value_tile_t(v_cache_ptr, base, kv_head, page_ok, PAGE_SIZE, HEAD_DIM)
        s_t = tl.dot(k, q_hi_t) * hi_scale[None, :]
        if Q_TERMS == 2:
            s_t += tl.dot(k, q_lo_t) * lo_scale[None, :]
        s_t = tl.where(tok_mask[:, None], s_t, float("-inf"))  # [BLOCK_N, BLOCK_H]
        m_new = tl.maximum(m_i, tl.max(s_t, 0))  # finite: every tile has a token
        alpha = tl.exp2(m_i - m_new)
        p_t = tl.exp2(s_t - m_new[None, :])
        l_acc = l_acc * alpha[None, :] + p_t
        acc = acc * alpha[None, :] + tl.dot(v_t, (p_t * P_SCALE).to(tl.float8e4nv))
        m_i = m_new

    pdl_release(USE_PDL)
    o, lse = normalize_rows(tl.trans(acc), m_i, tl.sum(l_acc, 0))
    o = o * (tl.load(v_scale_ptr) / P_SCALE)
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
    """Ask L2 for a split's first tile before the dependent-launch wait (as the bf16 kernel's
    ``decode_attention._first_tile_to_l2``): its keys' lines, and each page's run of values."""
    base, page_ok = tile_pages(table, start, end, stride_cache_page, PAGE_SIZE, BLOCK_N)
    key_rows = base[:, None] + tl.arange(0, PAGE_SIZE)[None, :] * stride_cache_tok
    key_lines = key_rows + kv_head * stride_cache_head
    prefetch_l2(
        k_cache_ptr + key_lines[:, :, None] + tl.arange(0, HEAD_DIM // LINE)[None, None, :] * LINE,
        page_ok[:, None, None],
    )
    run = base + kv_head * (HEAD_DIM * PAGE_SIZE)  # [pages]: a run of HEAD_DIM * PAGE_SIZE bytes
    value_lines = tl.arange(0, HEAD_DIM * PAGE_SIZE // 128) * 128
    prefetch_l2(v_cache_ptr + run[:, None] + value_lines[None, :], page_ok[:, None])
