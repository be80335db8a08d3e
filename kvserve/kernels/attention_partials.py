"""Split-K attention's shared pieces: a decode split's token range and its kv head's query
rows, the online-softmax state turned into an output row and its log-sum-exp, the partials
written by each split, and their merge (by a second kernel or by the split that arrives last).
Shared by the decode kernels (bf16 and FP8) and the prefill kernel.

Two ways to cut a decode batch into splits, both on the device from ``seq_lens`` (so a CUDA
graph's fixed grid of ``B * S`` programs a kv head serves any lengths):

- even: every sequence into S splits of its own length / S (``split_range``). A long sequence
  beside short ones gets S programs a head however many bytes it carries.
- balanced (``balanced_item``): one split length for the whole batch, the shortest whole number
  of tiles that cuts all its sequences into at most ``B * S`` splits together; a sequence gets
  as many splits as its length needs, and program ``j`` of a kv head takes the batch's ``j``-th
  split. With equal lengths both give the same splits.

Partials of split ``s`` of sequence ``b`` for query head ``h`` sit at row ``row0 + h * head_stride
+ s * split_stride`` of part_out [rows, D] / part_lse [rows]: even,
``row0 = b * Hq * S``, ``head_stride = S``, ``split_stride = 1``; balanced, the splits of the
batch in order, ``row0 = first * Hq``, ``head_stride = 1``, ``split_stride = Hq``, where
``first`` counts the splits of the sequences before ``b``."""

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
def decode_item(
    seq_lens_ptr, pid_b, pid_split, num_splits, min_split, budget, GROUP: tl.constexpr,
    BALANCED: tl.constexpr, MAX_SPLITS: tl.constexpr, MEAN_FLOOR: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, START_SEEN_ALIGNED: tl.constexpr,
):  # fmt: skip
    """The split a decode program (pid_b, kv head, pid_split) of a grid ``B x Hkv x S`` works
    on, cut even (``split_range``) or ``BALANCED`` (``balanced_item``): (sequence b, split,
    its length, the split length, start, end, the partials' row0, head_stride and
    split_stride, alone, past: an item past the batch's splits, whose program exits).
    ``START_SEEN_ALIGNED``: an even cut's start in ``split_range``'s form, a multiple of BLOCK_N
    the compiler sees (else in the form the bf16 kernel was measured in: with it the sm_90 loop
    of that kernel changes, unmeasured)."""
    num_kv_heads = tl.num_programs(1)
    if BALANCED:
        b, split, seq_len, split_len, start, end, row0, alone = balanced_item(
            seq_lens_ptr, pid_b, pid_split, budget, min_split, num_kv_heads * GROUP, MAX_SPLITS,
            MEAN_FLOOR, BLOCK_B, BLOCK_N,
        )  # fmt: skip
        head_stride, split_stride, past = 1, num_kv_heads * GROUP, b >= tl.num_programs(0)
    else:
        b, split = pid_b, pid_split
        if START_SEEN_ALIGNED:
            seq_len, split_len, start, end = split_range(
                seq_lens_ptr, b, split, num_splits, min_split, BLOCK_N
            )
        else:
            seq_len = tl.load(seq_lens_ptr + b)
            split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
            split_len = tl.maximum(split_len, min_split)
            start = split * split_len
            end = tl.minimum(start + split_len, seq_len)
        row0 = b.to(tl.int64) * num_kv_heads * GROUP * num_splits
        head_stride, split_stride, alone, past = num_splits, 1, False, False
    return (b, split, seq_len, split_len, start, end, row0, head_stride, split_stride, alone,
            past)  # fmt: skip


@jit
def balanced_splits(
    seq_lens_ptr, batch, budget, min_split, max_splits, MEAN_FLOOR: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """The batch's lengths [BLOCK_B] (0 past ``batch``), each sequence's split count (0 past
    ``batch``; at least 1, so a padding row's split 0 writes its zeros) and the one split length
    in tiles: the fewest tiles with at most ``budget`` splits in all and ``max_splits`` a
    sequence, none shorter than ``min_split`` (a multiple of BLOCK_N) nor, with ``MEAN_FLOOR``,
    than the batch's mean length (a batch that fills the GPU with one split a sequence splits
    only what is longer). Bisection over whole tiles; equal lengths take the first guess
    (``budget / batch`` splits each, as ``split_range``)."""
    idx = tl.arange(0, BLOCK_B)
    valid = idx < batch
    lens = tl.load(seq_lens_ptr + idx, mask=valid, other=0)
    longest = tl.max(lens, 0)
    total = tl.sum(lens, 0)
    lo = tl.cdiv(tl.cdiv(total, budget), BLOCK_N)
    lo = tl.maximum(tl.maximum(lo, tl.cdiv(tl.cdiv(longest, max_splits), BLOCK_N)), 1)
    lo = tl.maximum(lo, min_split // BLOCK_N)
    if MEAN_FLOOR:
        lo = tl.maximum(lo, tl.cdiv(tl.cdiv(total, batch), BLOCK_N))
    hi = tl.maximum(tl.cdiv(longest, BLOCK_N), lo)  # one split each: batch <= budget splits
    if _split_count(lens, valid, lo * BLOCK_N) <= budget:
        hi = lo
    while lo < hi:
        mid = (lo + hi) // 2
        if _split_count(lens, valid, mid * BLOCK_N) <= budget:
            hi = mid
        else:
            lo = mid + 1
    counts = tl.where(valid, tl.maximum(tl.cdiv(lens, hi * BLOCK_N), 1), 0)
    return lens, counts, hi


@jit
def _split_count(lens, valid, split_len):
    return tl.sum(tl.where(valid, tl.maximum(tl.cdiv(lens, split_len), 1), 0), 0)


@jit
def balanced_item(
    seq_lens_ptr, pid_b, pid_split, budget, min_split, num_heads, MAX_SPLITS: tl.constexpr,
    MEAN_FLOOR: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Program (pid_b, pid_split)'s split under ``balanced_splits``, the batch's item
    ``pid_split * B + pid_b``: (sequence b, its split index, its length, the split length, start,
    end, its partials' row0, whether it is the sequence's only split and stores its output
    itself: only with ``MEAN_FLOOR``). An item past the batch's splits gets b == B (its program
    exits)."""
    batch = tl.num_programs(0)
    item = pid_split * batch + pid_b
    lens, counts, tiles = balanced_splits(
        seq_lens_ptr, batch, budget, min_split, MAX_SPLITS, MEAN_FLOOR, BLOCK_B, BLOCK_N
    )
    ends = tl.cumsum(counts, 0)
    b = tl.sum((ends <= item).to(tl.int32), 0)
    here = tl.arange(0, BLOCK_B) == b
    first = tl.sum(tl.where(here, ends - counts, 0), 0)
    seq_len = tl.sum(tl.where(here, lens, 0), 0)
    alone = False  # in every balanced cut it took the bf16 kernel from 107 to 156 registers
    if MEAN_FLOOR:
        alone = tl.sum(tl.where(here, counts, 0), 0) == 1
    split = item - first
    split_len = tiles * BLOCK_N
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)
    return b, split, seq_len, split_len, start, end, first * num_heads, alone


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
    row_mask, seq_len, split, split_len, row0, head_stride, split_stride, alone, stride_ob,
    stride_oh, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, DIRECT: tl.constexpr,
    FUSED_MERGE: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    """A decode split's rows ``o`` [BLOCK_H, D] (query heads ``heads``): the output itself when
    every sequence has one split (``DIRECT``) or this one has (``alone``), else its partial
    (fp32, lse in log2 units) at the rows of the module docstring, merged here by the last
    split to arrive with ``FUSED_MERGE``."""
    dims = tl.arange(0, HEAD_DIM)
    out_off = b.to(tl.int64) * stride_ob + heads[:, None] * stride_oh + dims[None, :]
    if DIRECT:  # noqa: SIM114 - a constexpr, then a runtime flag (False when cut evenly)
        tl.store(out_ptr + out_off, o.to(out_ptr.dtype.element_ty), mask=row_mask[:, None])
    elif alone:
        tl.store(out_ptr + out_off, o.to(out_ptr.dtype.element_ty), mask=row_mask[:, None])
    else:
        part_row = row0 + heads * head_stride + split * split_stride
        tl.store(part_lse_ptr + part_row, lse, mask=row_mask)
        part_ptrs = part_out_ptr + part_row[:, None] * HEAD_DIM + dims[None, :]
        tl.store(part_ptrs, o, mask=row_mask[:, None])
        if FUSED_MERGE:
            merge_if_last(
                part_out_ptr, part_lse_ptr, out_ptr, counter_ptr, b, kv_head, num_kv_heads,
                seq_len, split_len, row0, head_stride, split_stride, stride_ob, stride_oh,
                GROUP, BLOCK_S, HEAD_DIM,
            )  # fmt: skip


@jit
def merge_if_last(
    part_out_ptr, part_lse_ptr, out_ptr, counter_ptr, b, kv_head, num_kv_heads, seq_len,
    split_len, row0, head_stride, split_stride, stride_ob, stride_oh, GROUP: tl.constexpr,
    BLOCK_S: tl.constexpr, HEAD_DIM: tl.constexpr,
):  # fmt: skip
    """The last of a (sequence, kv head)'s written splits to arrive merges its GROUP rows and
    puts the arrival count back to zero (so the counters need no reset between launches)."""
    counter = counter_ptr + b * num_kv_heads + kv_head
    written = tl.maximum(tl.cdiv(seq_len, tl.maximum(split_len, 1)), 1)  # as the early exit
    if arrive(counter) == written - 1:
        dims = tl.arange(0, HEAD_DIM)
        for r in tl.static_range(GROUP):
            head = kv_head * GROUP + r
            o = merge_partials(part_out_ptr, part_lse_ptr, row0 + head * head_stride,
                               split_stride, written, BLOCK_S, HEAD_DIM)  # fmt: skip
            out_off = b.to(tl.int64) * stride_ob + head * stride_oh + dims
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
    part_out_ptr,  # fp32 [rows, D]: each split's output, normalized over its keys
    part_lse_ptr,  # fp32 [rows]: each split's log2-sum-exp2 of scaled scores
    row,  # split 0's row; split s at row + s * split_stride
    split_stride,
    num_written,  # splits 0 .. num_written - 1 wrote (>= 1); an empty one may write lse = -inf
    BLOCK_S: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """One output row over all its splits, weighted by their share of the softmax; BLOCK_S
    splits at a time, so the work follows the splits written, not the most there could be."""
    dims = tl.arange(0, HEAD_DIM)
    m = tl.full([], float("-inf"), tl.float32)
    denom = tl.zeros([], tl.float32)
    acc = tl.zeros([HEAD_DIM], tl.float32)
    for s0 in range(0, num_written, BLOCK_S):
        splits = s0 + tl.arange(0, BLOCK_S)
        mask = splits < num_written
        rows = row + splits * split_stride
        # .cg: from L2, where the other SMs' stores are (the fused merge reads them in-kernel)
        lse = tl.load(part_lse_ptr + rows, mask=mask, other=float("-inf"), cache_modifier=".cg")
        part = tl.load(part_out_ptr + rows[:, None] * HEAD_DIM + dims[None, :],
                       mask=mask[:, None], other=0.0, cache_modifier=".cg")  # fmt: skip
        m_new = tl.maximum(m, tl.max(lse, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # all empty so far: weights 0
        w = tl.exp2(lse - m_safe)  # [BLOCK_S]
        rescale = tl.exp2(m - m_safe)
        acc = acc * rescale + tl.sum(part * w[:, None], 0)
        denom = denom * rescale + tl.sum(w, 0)
        m = m_new
    return acc / tl.where(denom == 0.0, 1.0, denom)  # seq_len 0: every split empty -> zeros
