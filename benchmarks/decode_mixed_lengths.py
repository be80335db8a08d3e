"""Decode attention over batches of unequal lengths: splits cut evenly per sequence against
splits by the batch's tokens (``DecodeConfig.balanced``), bf16 and FP8 caches, one layer.

    python -m benchmarks.decode_mixed_lengths --out-dir benchmarks/results

Llama-3-8B heads (32 q, 8 kv, head_dim 128, page 16); page tables as wide as a 128K-context
engine's graphs (8,192 pages), so the split count comes from batch and heads alone, as in the
engine. Batches: one long sequence beside short ones (a long document decoding among chats),
random lengths, the equal-length shapes of ``fp8_kv_decode`` (where both plans should give the
same splits; the balanced one pays its plan, a few reductions over the lengths), equal lengths
at batches that are not a power of two, and full batches of 40-256, where one split a sequence
fills the GPU (``--batches`` picks by name).
Each batch is timed inside one CUDA graph of several calls on different random page sets (so
the cache is not served from L2), the two plans alternating for three rounds (medians); bytes
are the K/V read once plus q/out/page tables, against device-to-device copy bandwidth.

Writes decode_mixed_lengths_<tag>_<date>.json.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace
from typing import Any

import torch

from benchmarks.common import captured_ms, copy_bandwidth_gbs, write_result
from kvserve.kernels.decode_attention import (
    FP8_DECODE_CONFIG,
    DecodeConfig,
    paged_decode_attention,
)

HQ, HKV, HEAD_DIM, PAGE = 32, 8, 128, 16
TABLE_WIDTH = 8192  # pages: a 128K-context engine's graph-wide tables
CALLS_PER_GRAPH = 4
ROUNDS = 3  # even and balanced alternate; medians reported
K = 1024


def batches() -> dict[str, list[int]]:
    gen = torch.Generator().manual_seed(0)
    random32 = torch.randint(K, 64 * K, (32,), generator=gen).tolist()
    return {
        "1x128K+31x1K": [128 * K] + [K] * 31,
        "1x128K+7x4K": [128 * K] + [4 * K] * 7,
        "2x64K+14x2K": [64 * K] * 2 + [2 * K] * 14,
        "1x32K+15x1K": [32 * K] + [K] * 15,
        "32 random 1K-64K": random32,
        "32x32K": [32 * K] * 32,
        "8x128K": [128 * K] * 8,
        "16x8K": [8 * K] * 16,
        "8x4K": [4 * K] * 8,
        "4x32K": [32 * K] * 4,
        "64x1K": [K] * 64,
        "1x1K": [K],
        # equal lengths, batches not a power of two: 24 x 8 kv heads at two splits a sequence
        # is 384 programs of the 528 an H200 holds at 4 an SM; 40 and 48 take the full-batch
        # cut below occupancy (0.90-0.94x of even splits, s50: its exiting second column)
        "24x32K": [32 * K] * 24,
        "40x8K": [8 * K] * 40,
        "48x4K": [4 * K] * 48,
        "96x2K": [2 * K] * 96,
        # full batches: one split a sequence fills the GPU (S == 1 from occupancy)
        "1x128K+127x1K": [128 * K] + [K] * 127,
        "1x64K+63x2K": [64 * K] + [2 * K] * 63,
        "128 random 1K-8K": torch.randint(K, 8 * K, (128,), generator=gen).tolist(),
        "128x1K": [K] * 128,
        "256x1K": [K] * 256,
        "128x4K": [4 * K] * 128,
    }


def time_batch(lens: list[int], cache: torch.Tensor, cfg: DecodeConfig, fp8: bool) -> float:
    """us per call: CALLS_PER_GRAPH calls on their own random page sets in one graph."""
    scales = (torch.tensor([0.05], device="cuda"), torch.tensor([0.05], device="cuda"))
    calls = []
    need = sum(-(-n // PAGE) for n in lens)
    for _ in range(CALLS_PER_GRAPH):
        perm = torch.randperm(cache.shape[1], device="cuda")[:need].to(torch.int32)
        tables = torch.zeros(len(lens), TABLE_WIDTH, dtype=torch.int32, device="cuda")
        used = 0
        for i, n in enumerate(lens):
            pages = -(-n // PAGE)
            tables[i, :pages] = perm[used : used + pages]
            used += pages
        seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        q = torch.randn(len(lens), HQ, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
        calls.append((q, tables, seq_lens, torch.empty_like(q)))

    def run() -> None:
        for q, tables, seq_lens, out in calls:
            paged_decode_attention(q, cache, tables, seq_lens, HEAD_DIM**-0.5, out,
                                   scales if fp8 else None, config=cfg)  # fmt: skip

    return captured_ms(run) / CALLS_PER_GRAPH * 1e3


def measure(kv_dtype: torch.dtype, copy_gbs: float, only: list[str]) -> dict[str, Any]:
    fp8 = kv_dtype == torch.float8_e4m3fn
    base = FP8_DECODE_CONFIG if fp8 else DecodeConfig()
    configs = {"even": replace(base, balanced=False), "balanced": replace(base, balanced=True)}
    most = max(sum(lens) for lens in batches().values())
    pages = 2 * most // PAGE  # random page subsets from twice the need
    cache = torch.randn(2, pages, PAGE, HKV, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    cache = cache.to(kv_dtype)
    rows = []
    for name, lens in batches().items():
        if only and name not in only:
            continue
        row: dict[str, Any] = {"batch": name, "size": len(lens), "tokens": sum(lens)}
        row["bytes"] = 2 * sum(lens) * HKV * HEAD_DIM * kv_dtype.itemsize
        runs: dict[str, list[float]] = {cname: [] for cname in configs}
        for _ in range(ROUNDS):  # alternating, each on its own page sets
            for cname, cfg in configs.items():
                runs[cname].append(time_batch(lens, cache, cfg, fp8))
        for cname, times in runs.items():
            us = statistics.median(times)
            row[f"{cname}_us"], row[f"{cname}_runs_us"] = us, times
            row[f"{cname}_of_copy"] = row["bytes"] / us / 1e3 / copy_gbs
        row["speedup"] = row["even_us"] / row["balanced_us"]
        print(f"{kv_dtype} {name}: even {row['even_us']:.1f} us ({row['even_of_copy']:.0%} of "
              f"copy), balanced {row['balanced_us']:.1f} us ({row['balanced_of_copy']:.0%}): "
              f"{row['speedup']:.2f}x", flush=True)  # fmt: skip
        rows.append(row)
    del cache
    torch.cuda.empty_cache()
    return {"rows": rows, "configs": {k: vars(v) for k, v in configs.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--tag", default="h200")
    ap.add_argument("--kv", default="bf16,fp8", help="cache dtypes: bf16, fp8")
    ap.add_argument("--batches", default="", help="the batches to run, by name (default all)")
    args = ap.parse_args()
    copy_gbs = copy_bandwidth_gbs()
    dtypes = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
    result: dict[str, Any] = {
        "heads": {"q": HQ, "kv": HKV, "head_dim": HEAD_DIM, "page": PAGE},
        "table_width_pages": TABLE_WIDTH,
        "copy_GBps": copy_gbs,
    }
    for kv in args.kv.split(","):
        result[kv] = measure(dtypes[kv], copy_gbs, [b for b in args.batches.split(",") if b])
    print(f"wrote {write_result(f'decode_mixed_lengths_{args.tag}', result, args.out_dir)}")


if __name__ == "__main__":
    main()
