"""Triton attention kernels (store, decode, prefill) and the Triton backend against the torch
reference backend, computed in fp32 on the same cache; the decoder's fused rotary + KV store path
against its unfused one.

``KVSERVE_TEST_DEVICE=cpu TRITON_INTERPRET=1 pytest --noconftest -k "not 16k"`` runs these
through Triton's interpreter on a CPU (slowly) to check the kernels without a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

pytest.importorskip("triton")

from kernel_test_device import BF16_UNLESS_INTERPRETED, DEVICE, INTERPRETED, NEEDS_CUDA_GRAPHS  # noqa: E402

from kvserve.config import ModelConfig  # noqa: E402
from kvserve.engine.runner.kv_pool import KVPool  # noqa: E402
from kvserve.engine.runner.warmup import warm_up_eager  # noqa: E402
from kvserve.kernels import skinny_gemm  # noqa: E402
from kvserve.kernels.activation import silu_and_mul  # noqa: E402
from kvserve.kernels.decode_attention import DecodeConfig, paged_decode_attention  # noqa: E402
from kvserve.kernels.options import KernelOptions  # noqa: E402
from kvserve.kernels.prefill_attention import (  # noqa: E402
    PrefillConfig,
    paged_prefill_attention,
)
from kvserve.kernels.rmsnorm import rms_norm  # noqa: E402
from kvserve.kernels.store_kv_cache import store_kv_cache, store_kv_cache_reference  # noqa: E402
from kvserve.layers.attention.metadata import AttentionMetadata  # noqa: E402
from kvserve.layers.attention.torch_backend import TorchAttentionBackend  # noqa: E402
from kvserve.layers.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from kvserve.models.decoder import DecoderForCausalLM  # noqa: E402
from kvserve.models.forward_context import ForwardContext  # noqa: E402

pytestmark = pytest.mark.gpu

TOL = {torch.bfloat16: 2e-2, torch.float16: 1e-2, torch.float32: 2e-4}


@dataclass
class PagedBatch:
    q: torch.Tensor  # [T, Hq, D]
    k: torch.Tensor  # [T, Hkv, D]
    v: torch.Tensor  # [T, Hkv, D]
    kv_cache: torch.Tensor  # [2, P, page, Hkv, D]; prefix filled, new rows not yet stored
    meta: AttentionMetadata


def make_batch(
    query_lens: list[int],
    seq_lens: list[int],
    *,
    page_size: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    seed: int = 0,
    spare_pages: int = 3,
    min_table_width: int = 0,
) -> PagedBatch:
    """Random q/k/v/cache; each sequence's pages are scattered over the cache in random order,
    and the page table is wider than needed (tail entries 0, as the contract says)."""
    gen = torch.Generator().manual_seed(seed)
    pages_per_seq = [max(1, -(-n // page_size)) for n in seq_lens]
    num_pages = sum(pages_per_seq) + spare_pages
    order = torch.randperm(num_pages, generator=gen)
    width = max(max(pages_per_seq) + 2, min_table_width)
    tables = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    slots: list[int] = []
    used = 0
    for i, (qlen, slen) in enumerate(zip(query_lens, seq_lens, strict=True)):
        tables[i, : pages_per_seq[i]] = order[used : used + pages_per_seq[i]].to(torch.int32)
        used += pages_per_seq[i]
        for pos in range(slen - qlen, slen):
            slots.append(int(tables[i, pos // page_size]) * page_size + pos % page_size)
    num_tokens = sum(query_lens)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype).to(DEVICE)

    starts = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    meta = AttentionMetadata(
        query_start_loc=starts.to(DEVICE),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        block_tables=tables.to(DEVICE),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=DEVICE),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        query_lens_cpu=list(query_lens),
        seq_lens_cpu=list(seq_lens),
    )
    return PagedBatch(
        q=rand(num_tokens, num_heads, head_dim),
        k=rand(num_tokens, num_kv_heads, head_dim),
        v=rand(num_tokens, num_kv_heads, head_dim),
        kv_cache=rand(2, num_pages, page_size, num_kv_heads, head_dim),
        meta=meta,
    )


def reference(batch: PagedBatch) -> torch.Tensor:
    """The torch backend in fp32 on copies; returns [T, Hq, D] fp32."""
    cache = batch.kv_cache.float().clone()
    scale = 1.0 / math.sqrt(batch.q.shape[-1])
    return TorchAttentionBackend().forward(
        batch.q.float(), batch.k.float(), batch.v.float(), cache, batch.meta, scale
    )


def run_prefill(batch: PagedBatch) -> torch.Tensor:
    """Store the new rows, then the prefill kernel over the whole batch."""
    store_kv_cache(batch.k, batch.v, batch.kv_cache, batch.meta.slot_mapping)
    m = batch.meta
    scale = 1.0 / math.sqrt(batch.q.shape[-1])
    return paged_prefill_attention(
        batch.q, batch.kv_cache, m.query_start_loc, m.seq_lens, m.block_tables,
        m.max_query_len, scale,
    )  # fmt: skip


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref.float(), atol=TOL[dtype], rtol=TOL[dtype])


# (head_dim, Hq, Hkv, page_size, dtype): every value of each axis appears at least once.
SHAPES = [
    (128, 32, 8, 16, torch.bfloat16),
    (128, 8, 8, 32, torch.float16),
    (64, 8, 4, 64, torch.bfloat16),
    (64, 16, 2, 1, torch.float16),
    (128, 16, 16, 16, torch.float32),
    (64, 8, 1, 32, torch.bfloat16),
]
SHAPE_IDS = [f"d{d}-q{hq}-kv{hkv}-p{p}-{str(t)[6:]}" for d, hq, hkv, p, t in SHAPES]


@pytest.mark.parametrize(("head_dim", "hq", "hkv", "page", "dtype"), SHAPES, ids=SHAPE_IDS)
def test_store_kv_cache_matches_reference_and_skips_negative_slots(
    head_dim: int, hq: int, hkv: int, page: int, dtype: torch.dtype
) -> None:
    b = make_batch(
        [5, 3],
        [9, 40],
        page_size=page,
        num_heads=hq,
        num_kv_heads=hkv,
        head_dim=head_dim,
        dtype=dtype,
    )
    slots = b.meta.slot_mapping.clone()
    slots[2] = -1  # a padding row: must leave the cache untouched
    expected = b.kv_cache.clone()
    keep = slots >= 0
    store_kv_cache_reference(b.k[keep], b.v[keep], expected, slots[keep])
    store_kv_cache(b.k, b.v, b.kv_cache, slots)
    assert torch.equal(b.kv_cache, expected)


DECODE_LENS = [[1, 17, 300, 1000], [4096, 33, 2500], [16], [999, 1024, 64, 7, 3000, 1, 12, 513]]


@pytest.mark.parametrize(("head_dim", "hq", "hkv", "page", "dtype"), SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("lens_idx", range(len(DECODE_LENS)))
def test_decode_matches_reference(
    head_dim: int, hq: int, hkv: int, page: int, dtype: torch.dtype, lens_idx: int
) -> None:
    lens = DECODE_LENS[lens_idx]
    b = make_batch(
        [1] * len(lens),
        lens,
        page_size=page,
        num_heads=hq,
        num_kv_heads=hkv,
        head_dim=head_dim,
        dtype=dtype,
        seed=lens_idx,
    )
    ref = reference(b)
    store_kv_cache(b.k, b.v, b.kv_cache, b.meta.slot_mapping)
    out = torch.full_like(b.q, float("nan"))  # every element must be written
    scale = 1.0 / math.sqrt(head_dim)
    paged_decode_attention(b.q, b.kv_cache, b.meta.block_tables, b.meta.seq_lens, scale, out=out)
    assert_close(out, ref, dtype)


# A 16-bit dtype for tests about indexing and splits, not the dtype: fp16 under the interpreter,
# which gets bf16 wrong
HALF = torch.float16 if INTERPRETED else torch.bfloat16


@pytest.mark.parametrize("balanced", [False, True])
@pytest.mark.parametrize("fused_merge", [False, True])
@pytest.mark.parametrize("num_splits", [1, 3, 64])
def test_decode_forced_split_counts(num_splits: int, fused_merge: bool, balanced: bool) -> None:
    lens = [1, 100, 2049, 640]
    b = make_batch(
        [1] * 4,
        lens,
        page_size=16,
        num_heads=8,
        num_kv_heads=2,
        head_dim=128,
        dtype=HALF,
        seed=num_splits,
    )
    ref = reference(b)
    store_kv_cache(b.k, b.v, b.kv_cache, b.meta.slot_mapping)
    out = paged_decode_attention(
        b.q,
        b.kv_cache,
        b.meta.block_tables,
        b.meta.seq_lens,
        128**-0.5,
        config=DecodeConfig(num_splits=num_splits, fused_merge=fused_merge, balanced=balanced),
    )
    assert_close(out, ref, HALF)


# (lengths, splits a sequence): one long sequence beside short ones, so the batch's splits go
# to it; lengths that make whole-tile rounding tight against the grid; a padding row (0)
# among them; equal lengths (the even plan)
BALANCED_CASES = [
    ([5000, 3, 40, 1, 70, 2], 2),
    ([1, 1, 1, 12000], 1),
    ([977, 2049, 31, 1500, 640, 3001, 65], 3),
    ([700, 0, 2500, 1], 4),
    ([1024] * 6, 5),
]


@pytest.mark.parametrize("fused_merge", [False, True])
@pytest.mark.parametrize("case", range(len(BALANCED_CASES)))
def test_decode_balanced_splits(case: int, fused_merge: bool) -> None:
    """Splits by the batch's tokens (``DecodeConfig.balanced``): the long sequence's many splits,
    their merge (kernel or last arrival; its counters end at zero) and the short sequences'
    single splits all land in the right rows."""
    lens, num_splits = BALANCED_CASES[case]
    cfg = DecodeConfig(block_n=32, num_splits=num_splits, fused_merge=fused_merge)
    check_lengths(lens, cfg, num_kv_heads=2, seed=case)


def check_lengths(lens: list[int], cfg: DecodeConfig, num_kv_heads: int, seed: int) -> None:
    """Decode over sequences of ``lens`` (0: a padding row, whose output must be zeros) under
    ``cfg`` against the reference; a fused merge's counters must end at zero."""
    b = make_batch(
        [1] * len(lens), [max(n, 1) for n in lens], page_size=16, num_heads=8,
        num_kv_heads=num_kv_heads, head_dim=64, dtype=HALF, seed=seed,
    )  # fmt: skip
    ref = reference(b)
    store_kv_cache(b.k, b.v, b.kv_cache, b.meta.slot_mapping)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEVICE)
    out = torch.full_like(b.q, float("nan"))
    paged_decode_attention(b.q, b.kv_cache, b.meta.block_tables, seq_lens, 0.125, out=out,
                           config=cfg)  # fmt: skip
    real = [i for i, n in enumerate(lens) if n > 0]
    padding = [i for i, n in enumerate(lens) if n == 0]
    assert torch.equal(out[padding], torch.zeros_like(out[padding]))
    assert_close(out[real], ref[real], HALF)
    assert int(skinny_gemm._COUNTERS.get(DEVICE, torch.zeros(1)).abs().sum()) == 0


@pytest.mark.parametrize("dtype", [BF16_UNLESS_INTERPRETED, torch.float16])
def test_decode_16k_context(dtype: torch.dtype) -> None:
    lens = [16384, 9000, 16383]
    b = make_batch(
        [1] * 3, lens, page_size=16, num_heads=32, num_kv_heads=8, head_dim=128, dtype=dtype
    )
    ref = reference(b)
    store_kv_cache(b.k, b.v, b.kv_cache, b.meta.slot_mapping)
    out = paged_decode_attention(b.q, b.kv_cache, b.meta.block_tables, b.meta.seq_lens, 128**-0.5)
    assert_close(out, ref, dtype)


# batches that fill the GPU with one split a sequence at one program an SM (36 x 4 kv heads
# against 132 SMs on CPU, 132 on the H200): one long sequence, equal lengths (left whole), a
# padding row, a spread of lengths
WIDE_CASES = [
    [3000] + [7] * 35,
    [300] * 36,
    [0, 1500, 900] + [40] * 33,
    [16 * i + 1 for i in range(36)],
]


@pytest.mark.parametrize("case", range(len(WIDE_CASES)))
def test_decode_balanced_splits_of_a_full_batch(case: int) -> None:
    """S == 1 from occupancy: balanced, the grid gets a second split a sequence and a budget of
    one more program a head for each the GPU holds; sequences longer than the mean are cut and
    merged by the last split to arrive, the rest write their outputs themselves."""
    check_lengths(WIDE_CASES[case], DecodeConfig(block_n=32, programs_per_sm=1), 4, seed=case)


# batches whose splits do not come out even under the 33 programs a kv head (one an SM, 4 kv
# heads): each sequence ends in a shorter split; equal lengths at six and at two splits a
# sequence, and unequal ones with a padding row
UNEVEN_CASES = [[1000] * 5, [1000] * 12, [512, 1000, 33, 4096, 0, 700]]


@pytest.mark.parametrize("fused_merge", [False, True])
@pytest.mark.parametrize("case", range(len(UNEVEN_CASES)))
def test_decode_balanced_splits_end_each_sequence_in_a_shorter_one(
    case: int, fused_merge: bool
) -> None:
    """Every sequence's whole splits and its shorter last one land in its own rows."""
    cfg = DecodeConfig(block_n=32, programs_per_sm=1, fused_merge=fused_merge)
    check_lengths(UNEVEN_CASES[case], cfg, 4, seed=case)


@pytest.mark.parametrize("balanced", [False, True])
@pytest.mark.parametrize("fused_merge", [False, True])
@pytest.mark.parametrize(("num_splits", "min_split_tokens"), [(8, 256), (64, 100), (3, 5000)])
def test_decode_min_split_tokens(
    num_splits: int, min_split_tokens: int, fused_merge: bool, balanced: bool
) -> None:
    """Splits no shorter than ``min_split_tokens``: short sequences fill fewer splits, the
    programs of the rest exit, the merge reads only what was written; a padding row gives 0.
    Fused: the last of the written splits to arrive merges, and the counters end at zero."""
    lens = [1, 100, 517, 1, 2000]
    b = make_batch(
        [1] * 5, lens, page_size=16, num_heads=8, num_kv_heads=2, head_dim=64,
        dtype=torch.float16, seed=num_splits,
    )  # fmt: skip
    ref = reference(b)
    store_kv_cache(b.k, b.v, b.kv_cache, b.meta.slot_mapping)
    seq_lens = b.meta.seq_lens.clone()
    seq_lens[3] = 0
    out = torch.full_like(b.q, float("nan"))
    cfg = DecodeConfig(block_n=32, num_splits=num_splits, min_split_tokens=min_split_tokens,
                       fused_merge=fused_merge, balanced=balanced)  # fmt: skip
    paged_decode_attention(b.q, b.kv_cache, b.meta.block_tables, seq_lens, 0.125, out=out,
                           config=cfg)  # fmt: skip
    assert torch.equal(out[3], torch.zeros_like(out[3]))
    assert_close(out[[0, 1, 2, 4]], ref[[0, 1, 2, 4]], torch.float16)
    assert int(skinny_gemm._COUNTERS.get(DEVICE, torch.zeros(1)).abs().sum()) == 0


@pytest.mark.skipif(INTERPRETED, reason="a 128K-token cache is too slow for the interpreter")
@pytest.mark.parametrize(("num_splits", "fused_merge"), [(None, False), (2, False), (64, False),
                                                         (None, True)])  # fmt: skip
def test_decode_128k_context_in_a_graph_wide_table(
    num_splits: int | None, fused_merge: bool
) -> None:
    """Long and short sequences in one launch, the page table as wide as a 128K-context
    engine's graphs use; splits past a short sequence's end exit and the merge skips them."""
    lens = [131072, 70001, 5, 1]
    b = make_batch(
        [1] * 4, lens, page_size=16, num_heads=32, num_kv_heads=8, head_dim=128,
        dtype=torch.bfloat16, min_table_width=8192,
    )  # fmt: skip
    ref = reference(b)
    store_kv_cache(b.k, b.v, b.kv_cache, b.meta.slot_mapping)
    out = torch.full_like(b.q, float("nan"))
    cfg = DecodeConfig(block_n=128, num_warps=4, num_stages=2, num_splits=num_splits)
    if num_splits is None:
        cfg = DecodeConfig(fused_merge=fused_merge)  # the defaults, splits from shapes
    scale = 128**-0.5
    paged_decode_attention(b.q, b.kv_cache, b.meta.block_tables, b.meta.seq_lens, scale, out=out,
                           config=cfg)  # fmt: skip
    assert_close(out, ref, torch.bfloat16)


def test_decode_padding_rows_give_zeros() -> None:
    b = make_batch(
        [1] * 3,
        [50, 1, 700],
        page_size=16,
        num_heads=8,
        num_kv_heads=2,
        head_dim=64,
        dtype=HALF,
    )
    ref = reference(b)
    store_kv_cache(b.k, b.v, b.kv_cache, b.meta.slot_mapping)
    seq_lens = b.meta.seq_lens.clone()
    seq_lens[1] = 0  # padding row of a CUDA-graph batch; its page-table row may be anything
    tables = b.meta.block_tables.clone()
    tables[1] = 0
    for splits in (1, 4):
        out = paged_decode_attention(
            b.q, b.kv_cache, tables, seq_lens, 0.125, config=DecodeConfig(num_splits=splits)
        )
        assert torch.equal(out[1], torch.zeros_like(out[1]))
        assert_close(out[[0, 2]], ref[[0, 2]], HALF)


# (query_lens, seq_lens): pure prefill, prefix hits ending mid-page, chunked, mixed with decodes.
PREFILL_CASES = [
    ([37], [37]),
    ([200, 1, 64], [200, 1, 64]),
    ([100, 1, 1, 300], [133, 77, 1025, 1000]),
    ([513, 2, 129], [1100, 15, 129]),
    ([1, 1, 50], [4000, 10, 81]),
]


@pytest.mark.parametrize(("head_dim", "hq", "hkv", "page", "dtype"), SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("case_idx", range(len(PREFILL_CASES)))
def test_prefill_matches_reference(
    head_dim: int, hq: int, hkv: int, page: int, dtype: torch.dtype, case_idx: int
) -> None:
    qlens, slens = PREFILL_CASES[case_idx]
    b = make_batch(
        qlens,
        slens,
        page_size=page,
        num_heads=hq,
        num_kv_heads=hkv,
        head_dim=head_dim,
        dtype=dtype,
        seed=case_idx,
    )
    assert_close(run_prefill(b), reference(b), dtype)


@pytest.mark.parametrize("block_m", [32, 64])
def test_prefill_lazy_rescale_matches_reference(block_m: int) -> None:
    """Scaled-up queries so that row maxima jump by more than the lazy threshold between
    tiles; chunks behind a cached prefix and a mid-page start."""
    b = make_batch(
        [70, 1, 129], [70, 50, 300], page_size=16, num_heads=4, num_kv_heads=2, head_dim=64,
        dtype=torch.float16, seed=block_m,
    )  # fmt: skip
    b.q.mul_(3.0)
    ref = reference(b)
    store_kv_cache(b.k, b.v, b.kv_cache, b.meta.slot_mapping)
    m = b.meta
    cfg = PrefillConfig(block_m, 16, 4, 2, lazy_rescale=True)
    out = paged_prefill_attention(
        b.q, b.kv_cache, m.query_start_loc, m.seq_lens, m.block_tables, m.max_query_len,
        64**-0.5, config=cfg,
    )  # fmt: skip
    assert_close(out, ref, torch.float16)


@pytest.mark.parametrize("kv_splits", [2, 3, 7])
@pytest.mark.parametrize("lazy_rescale", [False, True])
def test_prefill_key_splits_match_reference(kv_splits: int, lazy_rescale: bool) -> None:
    """Forced key splits: chunks behind long prefixes ending mid-page and mid-tile, a fresh
    prompt with fewer unmasked tiles than splits (empty splits), rows past a block's end."""
    b = make_batch(
        [40, 1, 70, 16], [1000, 20, 70, 531], page_size=16, num_heads=4, num_kv_heads=2,
        head_dim=64, dtype=torch.float16, seed=kv_splits,
    )  # fmt: skip
    b.q.mul_(2.0)  # row maxima that move between splits
    ref = reference(b)
    store_kv_cache(b.k, b.v, b.kv_cache, b.meta.slot_mapping)
    m = b.meta
    cfg = PrefillConfig(32, 16, 4, 2, lazy_rescale=lazy_rescale, kv_splits=kv_splits)
    out = paged_prefill_attention(
        b.q, b.kv_cache, m.query_start_loc, m.seq_lens, m.block_tables, m.max_query_len,
        64**-0.5, config=cfg,
    )  # fmt: skip
    assert_close(out, ref, torch.float16)


@pytest.mark.parametrize(
    ("qlens", "slens"),
    [([16384], [16384]), ([700, 1], [16384, 16000]), ([1500, 2048], [1500, 16384])],
    ids=["16k-fresh", "16k-prefix-mid-page", "16k-mixed"],
)
def test_prefill_16k(qlens: list[int], slens: list[int]) -> None:
    b = make_batch(
        qlens,
        slens,
        page_size=16,
        num_heads=8,
        num_kv_heads=2,
        head_dim=128,
        dtype=torch.bfloat16,
    )
    assert_close(run_prefill(b), reference(b), torch.bfloat16)


@pytest.mark.parametrize(
    ("qlens", "slens"),
    [
        ([1, 1, 1], [5, 300, 4097]),
        ([64, 1, 9], [64, 1000, 40]),
        ([1, 1, 64, 9], [300, 1000, 64, 40]),
        ([3, 1], [3, 2]),
    ],
    ids=["decode-only", "mixed", "decodes-first", "tiny"],
)
@pytest.mark.parametrize("dtype", [BF16_UNLESS_INTERPRETED, torch.float16])
def test_triton_backend_matches_torch_backend(
    qlens: list[int], slens: list[int], dtype: torch.dtype
) -> None:
    b = make_batch(
        qlens, slens, page_size=16, num_heads=32, num_kv_heads=8, head_dim=128, dtype=dtype
    )
    ref_cache = b.kv_cache.clone()
    ref = TorchAttentionBackend().forward(b.q, b.k, b.v, ref_cache, b.meta, 128**-0.5)
    out = TritonAttentionBackend().forward(b.q, b.k, b.v, b.kv_cache, b.meta, 128**-0.5)
    assert torch.equal(b.kv_cache, ref_cache)
    assert_close(out, ref, dtype)


@NEEDS_CUDA_GRAPHS
@pytest.mark.parametrize("fused_merge", [False, True])
def test_decode_step_replays_in_cuda_graph(fused_merge: bool) -> None:
    """Capture store + decode once, change seq_lens/block_tables/slot_mapping in place, replay."""
    b = make_batch(
        [1] * 4,
        [40, 1, 900, 333],
        page_size=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        dtype=torch.bfloat16,
        spare_pages=100,
        min_table_width=80,
    )
    m = b.meta
    out = torch.empty_like(b.q)

    def step() -> None:
        store_kv_cache(b.k, b.v, b.kv_cache, m.slot_mapping)
        paged_decode_attention(b.q, b.kv_cache, m.block_tables, m.seq_lens, 128**-0.5, out=out,
                               config=DecodeConfig(fused_merge=fused_merge))  # fmt: skip

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    # Next step: other lengths, other pages, row 1 turned into padding, fresh q/k/v.
    new_lens = [70, 0, 1201, 2]
    gen = torch.Generator().manual_seed(1)
    perm = torch.randperm(b.kv_cache.shape[1], generator=gen).tolist()
    tables = torch.zeros_like(m.block_tables, device="cpu")
    slots = []
    for i, n in enumerate(new_lens):
        pages = [perm.pop() for _ in range(-(-n // 16))]
        tables[i, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        slots.append(pages[(n - 1) // 16] * 16 + (n - 1) % 16 if n else -1)
    for t in (b.q, b.k, b.v):
        t.copy_(torch.randn(t.shape, generator=gen).to(t.dtype))
    m.seq_lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
    m.block_tables.copy_(tables)
    m.slot_mapping.copy_(torch.tensor(slots, dtype=torch.int64))
    graph.replay()
    torch.cuda.synchronize()
    replayed = out.clone()

    step()  # eager on the same inputs (the store rewrites the same values)
    torch.cuda.synchronize()
    assert torch.equal(replayed, out)
    assert torch.equal(replayed[1], torch.zeros_like(replayed[1]))
    rows = [0, 2, 3]
    ref_meta = AttentionMetadata(
        query_start_loc=torch.arange(4, dtype=torch.int32, device=DEVICE),
        seq_lens=m.seq_lens[rows],
        block_tables=m.block_tables[rows],
        slot_mapping=m.slot_mapping[rows],
        max_query_len=1,
        max_seq_len=1201,
        query_lens_cpu=[1, 1, 1],
        seq_lens_cpu=[new_lens[i] for i in rows],
    )
    ref = TorchAttentionBackend().forward(
        b.q[rows].float(),
        b.k[rows].float(),
        b.v[rows].float(),
        b.kv_cache.float(),
        ref_meta,
        128**-0.5,
    )
    assert_close(replayed[rows], ref, torch.bfloat16)


SM90 = (
    DEVICE.type == "cuda"
    and torch.cuda.is_available()
    and torch.cuda.get_device_capability(DEVICE) >= (9, 0)
)


@pytest.mark.skipif(not SM90, reason="programmatic dependent launch needs sm_90+")
@pytest.mark.parametrize("fused_merge", [False, True])
def test_programmatic_launch_chain_in_cuda_graph_equals_plain_launches(fused_merge: bool) -> None:
    """Norm -> KV store -> split decode + merge -> SiLU-mul -> norm, each reading what the one
    before wrote: launched with PDL and replayed from a graph many times, bit-equal to plain
    launches (an early read past ``pdl_wait`` would show as a mismatch)."""
    b = make_batch([1] * 8, [700, 1, 33, 2048, 900, 16, 1500, 64], page_size=16, num_heads=32,
                   num_kv_heads=8, head_dim=128, dtype=torch.bfloat16, spare_pages=50)  # fmt: skip
    m = b.meta
    cache0 = b.kv_cache.clone()
    weight = torch.rand(4096, device=DEVICE, dtype=torch.bfloat16) + 0.5
    x = torch.randn(8, 4096, device=DEVICE, dtype=torch.bfloat16)

    def step(pdl: bool) -> torch.Tensor:
        q = rms_norm(x, weight, 1e-6, pdl=pdl).view(8, 32, 128)
        store_kv_cache(b.k, b.v, b.kv_cache, m.slot_mapping, pdl=pdl)
        attn = paged_decode_attention(q, b.kv_cache, m.block_tables, m.seq_lens, 128**-0.5,
                                      config=DecodeConfig(num_splits=8, fused_merge=fused_merge),
                                      pdl=pdl)  # fmt: skip
        return rms_norm(silu_and_mul(attn.view(8, 4096), pdl=pdl), weight[:2048], 1e-6, pdl=pdl)

    expected = step(pdl=False)
    b.kv_cache.copy_(cache0)
    assert torch.equal(step(pdl=True), expected)  # eager
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(pdl=True)
    for _ in range(20):
        b.kv_cache.copy_(cache0)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected)


class _UnfusedTritonBackend(TritonAttentionBackend):
    """The Triton backend without the fused rotary store, so Attention keeps its unfused path."""

    name = "triton-unfused"
    fuses_rotary_store = False


def _tiny_decoder(dtype: torch.dtype, qk_norm: bool) -> DecoderForCausalLM:
    """Llama shape (Qwen3 with ``qk_norm``), random weights, every layer on its Triton kernel."""
    cfg = ModelConfig(
        architecture="LlamaForCausalLM", vocab_size=256, hidden_size=128, intermediate_size=256,
        num_layers=2, num_heads=8, num_kv_heads=2, head_dim=64, qk_norm=qk_norm,
    )  # fmt: skip
    model = DecoderForCausalLM(cfg, dtype, max_positions=4096, kernels=KernelOptions(triton=True))
    gen = torch.Generator().manual_seed(0)
    for name, param in model.named_parameters():
        if "norm" in name:
            param.data.fill_(1.0)
        else:
            param.data.copy_(torch.rand(param.shape, generator=gen) * 0.2 - 0.1)
    return model.to(DEVICE).eval()


# (query_lens, seq_lens): a mixed step (decodes first, then a prefill), a decode-only step.
DECODER_STEPS = [([1, 1, 9], [40, 17, 9]), ([1, 1, 1], [41, 18, 10])]


@pytest.mark.parametrize("qk_norm", [False, True], ids=["llama", "qwen3-qk-norm"])
@pytest.mark.parametrize("step", range(len(DECODER_STEPS)), ids=["mixed", "decode"])
@pytest.mark.parametrize("dtype", [BF16_UNLESS_INTERPRETED, torch.float32])
def test_decoder_fused_rotary_store_equals_unfused_path(
    dtype: torch.dtype, step: int, qk_norm: bool
) -> None:
    model = _tiny_decoder(dtype, qk_norm)
    qlens, slens = DECODER_STEPS[step]
    b = make_batch(
        qlens, slens, page_size=16, num_heads=8, num_kv_heads=2, head_dim=64, dtype=dtype,
        seed=step,
    )  # fmt: skip
    if b.meta.is_decode_only:  # row 1 as the padding row of a CUDA-graph batch
        b.meta.slot_mapping[1], b.meta.seq_lens[1] = -1, 0
    positions = torch.cat([torch.arange(s - q, s) for q, s in zip(qlens, slens)]).to(DEVICE)
    gen = torch.Generator().manual_seed(step)
    token_ids = torch.randint(0, 256, (sum(qlens),), generator=gen).to(DEVICE)
    attn = model.model.layers[0].self_attn
    results = []
    for backend in (TritonAttentionBackend(), _UnfusedTritonBackend()):
        caches = [b.kv_cache.clone() for _ in range(2)]
        ctx = ForwardContext(b.meta, KVPool(caches), backend)
        assert attn._fuses_rotary_store(ctx) == backend.fuses_rotary_store  # q/k norm too
        with torch.inference_mode():
            results.append((model(token_ids, positions, ctx), caches))
    (fused_out, fused_caches), (out, caches) = results
    assert torch.isfinite(out).all()
    if not qk_norm:  # rotary and store: the same arithmetic, fused or not
        assert torch.equal(fused_out, out)
        for fused_cache, cache in zip(fused_caches, caches, strict=True):
            assert torch.equal(fused_cache, cache)
        return
    # q/k norm runs inside the fused kernel on one path and in the RMSNorm kernel on the other:
    # the same rounding, but sums over a head's dims may be taken in another order
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(fused_out, out, atol=tol, rtol=tol)
    for fused_cache, cache in zip(fused_caches, caches, strict=True):
        torch.testing.assert_close(fused_cache, cache, atol=tol, rtol=tol)


def test_eager_warm_up_runs_every_step_kind_and_leaves_the_pool_untouched() -> None:
    """The tiny decoder's 4096 positions reach the split-prefill step too; 40 decode rows
    reach a balanced cut of a batch past 32 (a second batch block)."""
    dtype = torch.float16
    model = _tiny_decoder(dtype, qk_norm=False)
    gen = torch.Generator().manual_seed(3)
    caches = [torch.randn(2, 40, 16, 2, 64, generator=gen).to(dtype).to(DEVICE) for _ in range(2)]
    before = [c.clone() for c in caches]
    warm_up_eager(
        model, KVPool(caches), TritonAttentionBackend(), DEVICE, context_length=4096,
        max_decodes=40,
    )  # fmt: skip
    for cache, old in zip(caches, before, strict=True):
        assert torch.equal(cache, old)
