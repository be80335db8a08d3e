"""Split-K attention's shared pieces: a decode split's token range and its kv head's query
rows, the online-softmax state turned into an output row and its log-sum-exp, the partials
written by each split, and their merge (by a second kernel or by the split that arrives last).
Shared by the decode kernels (bf16 and FP8) and the prefill kernel."""

from __future__ import annotations

from kvserve.kernels._triton import jit, tl
from kvserve.kernels.skinny_gemm import arrive


@jit
def split_range(seq_lens_ptr, b, split, num_splits, min_split, BLOCK_N: tl.constexpr):
    """Sequence ``b``'s length, and split ``split``'s length and token range [start, end): the
    sequence cut into num_splits runs of whole tiles, none shorter than ``min_split`` (a multiple
    of BLOCK_N). A short sequence fills only its first few splits; the others get start >= end.
    start is written as a multiple of BLOCK_N that the compiler can see."""
    seq_len = tl.load(seq_lens_ptr + b)
    split_tiles = tl.maximum(tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N), min_split // BLOCK_N)
    start = split * split_tiles * BLOCK_N
    split_len = split_tiles * BLOCK_N
    return seq_len, split_len, start, tl.minimum(start + split_len, seq_len)


@jit
def load_group_rows(
    q_ptr, b, kv_head, stride_qb, stride_qh, GROUP: tl.constexpr, BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):  # fmt: skip
    """The GROUP query rows of kv head ``kv_head`` (row r is query head kv_head * GROUP + r),
    zeros past GROUP: (q [BLOCK_H, D], their query heads, the row mask)."""
    rows = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, HEAD_DIM)
    row_mask = rows < GROUP
    heads = kv_head * GROUP + rows
    q_off = b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + dims[None, :]
    return tl.load(q_ptr + q_off, mask=row_mask[:, None], other=0.0), heads, row_mask


@jit
def store_split_output(
    o, lse, part_out_ptr, part_lse_ptr, out_ptr, counter_ptr, b, kv_head, num_kv_heads, heads,
    row_mask, seq_len, split, split_len, num_splits, stride_ob, stride_oh, GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr, DIRECT: tl.constexpr, FUSED_MERGE: tl.constexpr,
    BLOCK_S: tl.constexpr,
):  # fmt: skip
    """A decode split's rows ``o`` [BLOCK_H, D] (query heads ``heads``): the output itself when
    the sequence has one split (``DIRECT``), else its partial (part_out [B, Hq, S, D] fp32,
    part_lse [B, Hq, S], log2 units), merged here by the last split to arrive with
    ``FUSED_MERGE``."""
    dims = tl.arange(0, HEAD_DIM)
    if DIRECT:
        out_off = b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + dims[None, :]
        tl.store(out_ptr + out_off, o.to(out_ptr.dtype.element_ty), mask=row_mask[:, None])
    else:
        part_row = (b.to(tl.int64) * num_kv_heads * GROUP + heads) * num_splits + split
        tl.store(part_lse_ptr + part_row, lse, mask=row_mask)
        part_ptrs = part_out_ptr + part_row[:, None] * HEAD_DIM + dims[None, :]
        tl.store(part_ptrs, o, mask=row_mask[:, None])
        if FUSED_MERGE:
            merge_if_last(
                part_out_ptr, part_lse_ptr, out_ptr, counter_ptr, b, kv_head, num_kv_heads,
                seq_len, split_len, num_splits, stride_ob, stride_oh, GROUP, BLOCK_S, HEAD_DIM,
            )  # fmt: skip


@jit
def merge_if_last(
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
