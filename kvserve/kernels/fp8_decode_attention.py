"""Paged decode attention over an FP8 (e4m3) cache on FP8 tensor cores (Hopper's wgmma).

The split kernel of ``decode_attention`` widens every FP8 tile to fp16 for ``mma.sync``: its
values, the PV product's B operand in [tokens, D] order, are read back from shared memory a
byte at a time, and the widening costs one conversion per two values. Here both products run
on FP8 tensor cores with the tile on the wgmma's M side (swap-AB: a decode step has a GQA
group's few query rows, and wgmma needs 64):

    S^T [N, G] = K [N, D] @ Q8^T [D, G]        (K-major: the keys' D values are contiguous)
    O^T [D, G] += V^T [D, N] @ P8^T [N, G]     (K-major only if V is stored dims-major)

So this kernel reads values stored dims-major (``V_DIMS_MAJOR``): a page holds, for each kv
head, D runs of PAGE_SIZE tokens. q is quantized to e4m3 per row (its scale folded into the
row's softmax scale) and p to e4m3 times ``P_SCALE`` (p is in [0, 1]: the factor keeps its
small values out of e4m3's subnormals; undone with the value scale).
"""

from __future__ import annotations

from kvserve.kernels._triton import jit, pdl_release, pdl_wait, tl
from kvserve.kernels.decode_attention import _first_tile_to_l2, _merge_if_last, normalize_rows

P_SCALE = tl.constexpr(256.0)
E4M3_MAX = tl.constexpr(448.0)


@jit(do_not_specialize=("stride_bt", "num_splits", "min_split"))
def _fp8_decode_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
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
    min_split,
    PAGE_SIZE: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIRECT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    FP8: tl.constexpr,
    FP8_MODE: tl.constexpr,
    USE_PDL: tl.constexpr,
    FUSED_MERGE: tl.constexpr,
    BLOCK_S: tl.constexpr,
    EARLY_LOADS: tl.constexpr,
    LINE: tl.constexpr,
    HEADS_INNER: tl.constexpr = False,  # grid (Hkv, B, S): a token's kv heads read together
):
    if not EARLY_LOADS:
        pdl_wait(USE_PDL)
    if HEADS_INNER:
        b = tl.program_id(1)
        kv_head = tl.program_id(0)
        num_kv_heads = tl.num_programs(0)
    else:
        b = tl.program_id(0)
        kv_head = tl.program_id(1)
        num_kv_heads = tl.num_programs(1)
    split = tl.program_id(2)

    seq_len = tl.load(seq_lens_ptr + b)
    split_tiles = tl.maximum(tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N), min_split // BLOCK_N)
    split_len = split_tiles * BLOCK_N
    start = split * split_tiles * BLOCK_N  # a multiple of BLOCK_N the compiler can see
    end = tl.minimum(start + split_len, seq_len)
    if split > 0 and start >= end:
        return
    table = block_tables_ptr + b.to(tl.int64) * stride_bt
    if EARLY_LOADS:
        _first_tile_to_l2(
            k_cache_ptr, v_cache_ptr, table, start, end, kv_head, stride_cache_page,
            stride_cache_tok, stride_cache_head, PAGE_SIZE, BLOCK_N, HEAD_DIM, LINE,
        )  # fmt: skip
        pdl_wait(USE_PDL)

    rows = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, HEAD_DIM)
    row_mask = rows < GROUP
    heads = kv_head * GROUP + rows
    q_off = b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + dims[None, :]
    q = tl.load(q_ptr + q_off, mask=row_mask[:, None], other=0.0).to(tl.float32)
    # q as the sum of two e4m3 rows, each with its own scale: e4m3 alone (3 mantissa bits) would
    # add about as much error to the scores as the keys' own rounding (an extra MMA is cheap)
    q_hi, hi_scale = _to_e4m3_rows(q)
    q_lo, lo_scale = _to_e4m3_rows(q - q_hi.to(tl.float32) * hi_scale[:, None])
    q_hi_t, q_lo_t = tl.trans(q_hi), tl.trans(q_lo)  # [D, BLOCK_H]
    score_scale = scale_log2 * tl.load(k_scale_ptr)
    hi_scale, lo_scale = hi_scale * score_scale, lo_scale * score_scale

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_acc = tl.zeros([BLOCK_N, BLOCK_H], tl.float32)  # summed over tokens once, at the end
    acc = tl.zeros([HEAD_DIM, BLOCK_H], tl.float32)  # O^T
    v_head = kv_head * (HEAD_DIM * PAGE_SIZE)
    slots = tl.arange(0, PAGE_SIZE)
    for n0 in range(start, end, BLOCK_N):
        toks = n0 + tl.arange(0, BLOCK_N)
        tok_mask = toks < end
        # A tile's pages, each read whole (the last page's slots past ``end`` hold finite
        # values: the pool starts zeroed and stores saturate; they meet p = 0)
        tile_pages = n0 // PAGE_SIZE + tl.arange(0, BLOCK_N // PAGE_SIZE)
        page_ok = tile_pages * PAGE_SIZE < end
        base = tl.load(table + tile_pages, mask=page_ok, other=0).to(tl.int64) * stride_cache_page
        k_rows = base[:, None] + slots[None, :] * stride_cache_tok + kv_head * stride_cache_head
        k_rows = tl.multiple_of(tl.reshape(k_rows, (BLOCK_N,)), 16)
        k = tl.load(k_cache_ptr + k_rows[:, None] + dims[None, :], mask=tok_mask[:, None],
                    other=0.0)  # fmt: skip
        # [pages, D, slots]: each page's 2 KB run read in memory order, then seen as [D, N]
        v_run = dims[:, None] * PAGE_SIZE + slots[None, :]  # [D, slots]
        v_ptrs = (base + v_head)[:, None, None] + v_run[None, :, :]
        v3 = tl.load(v_cache_ptr + v_ptrs, mask=page_ok[:, None, None], other=0.0)
        v_t = tl.reshape(tl.permute(v3, (1, 0, 2)), (HEAD_DIM, BLOCK_N))
        s_t = tl.dot(k, q_hi_t) * hi_scale[None, :] + tl.dot(k, q_lo_t) * lo_scale[None, :]
        s_t = tl.where(tok_mask[:, None], s_t, float("-inf"))  # [BLOCK_N, BLOCK_H]
        m_new = tl.maximum(m_i, tl.max(s_t, 0))
        alpha = tl.exp2(m_i - m_new)
        p_t = tl.exp2(s_t - m_new[None, :])
        l_acc = l_acc * alpha[None, :] + p_t
        acc = acc * alpha[None, :] + tl.dot(v_t, (p_t * P_SCALE).to(tl.float8e4nv))
        m_i = m_new

    pdl_release(USE_PDL)
    o, lse = normalize_rows(tl.trans(acc), m_i, tl.sum(l_acc, 0))
    o = o * (tl.load(v_scale_ptr) / P_SCALE)
    if DIRECT:
        out_off = b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + dims[None, :]
        tl.store(out_ptr + out_off, o.to(out_ptr.dtype.element_ty), mask=row_mask[:, None])
    else:
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
def _to_e4m3_rows(x):
    """x [R, C] fp32 as e4m3 rows and their scales: x ~ e4m3 * scale[:, None]."""
    amax = tl.max(tl.abs(x), 1)
    scale = tl.where(amax > 0, amax / E4M3_MAX, 1.0)
    return (x / scale[:, None]).to(tl.float8e4nv), scale
