"""Attention kernels on the GPU against the ceilings measured in the same run.

Decode: bytes of K/V read (plus q, out, page tables) per second, against a large device-to-device
copy (bytes read + written per second). Prefill: causal FLOPs (2 * 2 * Hq * D * L^2 / 2) per
second, against a bf16 8192^3 matmul and against torch's own SDPA (flash) on unpaged tensors.
Shapes: Llama-3-8B attention (32 q heads, 8 kv heads, D = 128), bf16, page 16.

    python -m benchmarks.kernels_h200 --out $OUT/kernels.json [--sweep]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton

from benchmarks.common import (
    copy_bandwidth_gbs,
    graph_replay_ms,
    matmul_tflops,
    median_ms,
    stamp,
    write_json,
)
from kvserve.kernels.decode_attention import DecodeConfig, num_decode_splits, paged_decode_attention
from kvserve.kernels.prefill_attention import (
    PrefillConfig,
    default_prefill_config,
    paged_prefill_attention,
)

HQ, HKV, HEAD_DIM, PAGE = 32, 8, 128, 16
DTYPE = torch.bfloat16
DECODE_BATCHES = [1, 8, 64, 256]
CONTEXTS = [1024, 4096, 16384]
SCALE = HEAD_DIM**-0.5


class DecodeShapes:
    """One KV cache big enough for the largest B x ctx; each shape takes a random page subset."""

    def __init__(self) -> None:
        max_tokens = max(DECODE_BATCHES) * max(CONTEXTS)
        self.num_pages = max_tokens // PAGE
        self.kv_cache = torch.randn(
            2, self.num_pages, PAGE, HKV, HEAD_DIM, dtype=DTYPE, device="cuda"
        )

    def inputs(self, batch: int, ctx: int, width: int = 0) -> tuple[torch.Tensor, ...]:
        """``width``: page-table columns (0: just the context's pages). The engine's CUDA graphs
        use the widest table the context length allows, padded with page 0."""
        pages = ctx // PAGE
        perm = torch.randperm(self.num_pages, device="cuda")[: batch * pages]
        tables = perm.view(batch, pages).to(torch.int32)
        if width > pages:
            tables = torch.nn.functional.pad(tables, (0, width - pages))
        seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
        q = torch.randn(batch, HQ, HEAD_DIM, dtype=DTYPE, device="cuda")
        return q, tables, seq_lens

    def run(self, batch: int, ctx: int, config: DecodeConfig | None = None, width: int = 0) -> dict:
        q, tables, seq_lens = self.inputs(batch, ctx, width)
        out = torch.empty_like(q)

        def call() -> None:
            paged_decode_attention(
                q, self.kv_cache, tables, seq_lens, SCALE, out=out, config=config
            )

        eager_ms = median_ms(call)
        kv_bytes = 2 * batch * ctx * HKV * HEAD_DIM * DTYPE.itemsize
        total = kv_bytes + 2 * q.numel() * q.element_size() + tables.numel() * 4
        graph_ms = self.graph_ms(batch, ctx, kv_bytes, config, width)
        splits = (config and config.num_splits) or num_decode_splits(
            batch,
            HKV,
            tables.shape[1] * PAGE,
            torch.cuda.get_device_properties(0).multi_processor_count,
        )
        return {
            "batch": batch,
            "ctx": ctx,
            "splits": splits,
            "graph_us": graph_ms * 1e3,
            "eager_us": eager_ms * 1e3,
            "bytes": total,
            "gbs": total / graph_ms / 1e6,
            "eager_gbs": total / eager_ms / 1e6,
        }

    def graph_ms(
        self, batch: int, ctx: int, kv_bytes: int, config: DecodeConfig | None, width: int = 0
    ) -> float:
        """Per call, inside one CUDA graph of n calls on n input sets (random pages each), so
        that small shapes are not served from L2 and host launch cost is left out, as in the
        engine's graph-captured decode step."""
        n = max(1, min(100, -(-(512 << 20) // kv_bytes)))
        sets = [self.inputs(batch, ctx, width) for _ in range(n)]
        outs = [torch.empty_like(q) for q, _, _ in sets]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for (q, tables, seq_lens), out in zip(sets, outs, strict=True):
                paged_decode_attention(
                    q, self.kv_cache, tables, seq_lens, SCALE, out=out, config=config
                )
        return graph_replay_ms(graph, replays=10, warmup=3) / n

    def host_us(self, batch: int, ctx: int, calls: int = 200) -> float:
        """Host time per eager call (launches only; the GPU work here is shorter)."""
        q, tables, seq_lens = self.inputs(batch, ctx)
        out = torch.empty_like(q)
        paged_decode_attention(q, self.kv_cache, tables, seq_lens, SCALE, out=out)  # compile
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            paged_decode_attention(q, self.kv_cache, tables, seq_lens, SCALE, out=out)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        return (t1 - t0) / calls * 1e6


def prefill_inputs(
    seq_len: int, qlen: int | None = None, page: int = PAGE
) -> tuple[torch.Tensor, ...]:
    """One sequence of ``seq_len`` cached tokens whose last ``qlen`` (default: all) are the
    new rows, its pages (``page`` tokens each) in random order."""
    qlen = seq_len if qlen is None else qlen
    pages = seq_len // page
    kv_cache = torch.randn(2, pages, page, HKV, HEAD_DIM, dtype=DTYPE, device="cuda")
    tables = torch.randperm(pages, device="cuda").to(torch.int32)[None, :]
    q = torch.randn(qlen, HQ, HEAD_DIM, dtype=DTYPE, device="cuda")
    qsl = torch.tensor([0, qlen], dtype=torch.int32, device="cuda")
    seq_lens = torch.tensor([seq_len], dtype=torch.int32, device="cuda")
    return q, kv_cache, qsl, seq_lens, tables


def causal_flops(seq_len: int) -> float:
    return 2 * 2 * HQ * HEAD_DIM * seq_len**2 / 2


def run_prefill(seq_len: int, config: PrefillConfig | None = None) -> dict:
    q, kv_cache, qsl, seq_lens, tables = prefill_inputs(seq_len)
    ms = median_ms(
        lambda: paged_prefill_attention(
            q, kv_cache, qsl, seq_lens, tables, seq_len, SCALE, config=config
        )
    )
    cfg = config or default_prefill_config(HEAD_DIM, DTYPE)
    return {
        "seq_len": seq_len,
        "ms": ms,
        "tflops": causal_flops(seq_len) / ms / 1e9,
        "config": vars(cfg),
    }


def run_sdpa(seq_len: int) -> dict:
    """torch's SDPA (flash) on contiguous, unpaged [1, H, L, D]: a practical ceiling."""
    q = torch.randn(1, HQ, seq_len, HEAD_DIM, dtype=DTYPE, device="cuda")
    k = torch.randn(1, HQ, seq_len, HEAD_DIM, dtype=DTYPE, device="cuda")
    v = torch.randn_like(k)
    ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=SCALE))
    return {"seq_len": seq_len, "ms": ms, "tflops": causal_flops(seq_len) / ms / 1e9}


DECODE_SWEEP = [
    DecodeConfig(block_n=bn, num_warps=w, num_stages=st)
    for bn, w, st in [
        (32, 4, 2),
        (32, 4, 3),
        (64, 4, 2),
        (64, 4, 3),
        (64, 8, 2),
        (128, 4, 2),
        (128, 4, 3),
    ]
]
PREFILL_SWEEP = [
    PrefillConfig(128, 64, 4, 3),
    PrefillConfig(128, 64, 4, 2),
    PrefillConfig(128, 64, 4, 4),
    PrefillConfig(128, 64, 8, 3),
    PrefillConfig(128, 128, 8, 2),
    PrefillConfig(128, 128, 8, 3),
    PrefillConfig(256, 64, 8, 2),
    PrefillConfig(256, 64, 8, 3),
]


def try_run(fn: Callable[..., dict], *args: object) -> dict:
    """A config that does not compile (e.g. too much shared memory) is recorded, not fatal."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - any compile/launch failure of one config
        return {"error": f"{type(exc).__name__}: {str(exc)[:200]}", "gbs": 0.0, "tflops": 0.0}


def sweep(decode: DecodeShapes) -> dict:
    result: dict = {"decode": [], "prefill": []}
    for batch, ctx in [(8, 16384), (64, 4096), (256, 16384)]:
        for cfg in DECODE_SWEEP:
            row = try_run(decode.run, batch, ctx, cfg)
            row["config"] = vars(cfg)
            result["decode"].append(row)
            print(f"sweep decode B={batch} ctx={ctx} {vars(cfg)}: {row['gbs']:.0f} GB/s")
    # 1K: the size of the prefill steps the engine keeps on this kernel beside cuDNN (under
    # 2**22 query-key pairs)
    for seq_len in (1024, 4096, 16384):
        for pcfg in PREFILL_SWEEP:
            row = try_run(run_prefill, seq_len, pcfg)
            result["prefill"].append(row)
            print(f"sweep prefill L={seq_len} {vars(pcfg)}: {row['tflops']:.0f} TFLOP/s")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--sweep", action="store_true", help="also try other block configs")
    args = parser.parse_args()

    props = torch.cuda.get_device_properties(0)
    copy_gbs, mm_tflops = copy_bandwidth_gbs(), matmul_tflops()
    print(f"copy {copy_gbs:.0f} GB/s, bf16 matmul {mm_tflops:.0f} TFLOP/s")
    decode = DecodeShapes()
    decode_rows = []
    host_us = decode.host_us(1, 1024)
    for batch in DECODE_BATCHES:
        for ctx in CONTEXTS:
            row = decode.run(batch, ctx)
            row["ratio_copy"] = row["gbs"] / copy_gbs
            decode_rows.append(row)
    prefill_rows = []
    for seq_len in CONTEXTS:
        row = run_prefill(seq_len)
        row["ratio_matmul"] = row["tflops"] / mm_tflops
        row["sdpa_tflops"] = run_sdpa(seq_len)["tflops"]
        row["ratio_sdpa"] = row["tflops"] / row["sdpa_tflops"]
        prefill_rows.append(row)
    result = {
        **stamp("kernels_h200"),
        "device": props.name,
        "num_sms": props.multi_processor_count,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "shape": {
            "num_heads": HQ,
            "num_kv_heads": HKV,
            "head_dim": HEAD_DIM,
            "page_size": PAGE,
            "dtype": str(DTYPE),
        },
        "ceilings": {"copy_gbs": copy_gbs, "matmul_bf16_tflops": mm_tflops},
        "decode_host_us_per_call": host_us,
        "decode": decode_rows,
        "prefill": prefill_rows,
    }
    if args.sweep:
        result["sweep"] = sweep(decode)
    write_json(args.out, result, indent=1)
    print_table(result)


def print_table(result: dict) -> None:
    c = result["ceilings"]
    print(
        f"\n{result['device']}: copy {c['copy_gbs']:.0f} GB/s, "
        f"bf16 matmul {c['matmul_bf16_tflops']:.0f} TFLOP/s, "
        f"decode host overhead {result['decode_host_us_per_call']:.0f} us/call"
    )
    print("decode   B    ctx  splits  graph us  eager us     GB/s  of copy")
    for r in result["decode"]:
        cols = f"{r['batch']:4d} {r['ctx']:6d} {r['splits']:6d} {r['graph_us']:9.1f}"
        print(f"      {cols} {r['eager_us']:9.1f} {r['gbs']:8.0f}  {r['ratio_copy']:6.1%}")
    print("prefill      L      ms  TFLOP/s  of matmul  SDPA TF  of SDPA")
    for r in result["prefill"]:
        cols = f"{r['seq_len']:6d} {r['ms']:7.2f} {r['tflops']:8.0f}   {r['ratio_matmul']:6.1%}"
        print(f"       {cols}  {r['sdpa_tflops']:7.0f}  {r['ratio_sdpa']:6.1%}")


if __name__ == "__main__":
    main()
