"""Attention kernels at long context on the GPU: the decode split count and tile config, and the
prefill tile config, tried at 32K and 128K (and at 1K, to see what a choice costs there), to set
the defaults from H200 data.

Decode runs as the engine's CUDA graphs run it: page tables as wide as a 128K context (8192
columns of 16 tokens), one graph of many calls on rotating inputs, bytes read against the copy
ceiling. Prefill runs the shapes the engine launches for a long prompt: a whole prompt, and a
chunk of new rows behind a long cached prefix; causal FLOPs against the matmul ceiling.

    python -m benchmarks.long_context_sweep --out $OUT/long_context_sweep.json [--quick]
        [--parts decode,prefill,chunks]
"""

from __future__ import annotations

import argparse
import itertools
import math
import time

import torch

from benchmarks.common import copy_bandwidth_gbs, matmul_tflops, stamp, write_json
from benchmarks.kernels_h200 import (
    DTYPE,
    HEAD_DIM,
    HKV,
    HQ,
    PAGE,
    SCALE,
    DecodeShapes,
    prefill_inputs,
    try_run,
)
from kvserve.kernels._triton import sm_count
from kvserve.kernels.decode_attention import DecodeConfig, num_decode_splits
from kvserve.kernels.prefill_attention import (
    PrefillConfig,
    default_prefill_config,
    num_prefill_kv_splits,
    paged_prefill_attention,
)

WIDTH = 131072 // PAGE  # page-table columns of a 128K-context engine
DECODE_SHAPES = [(32, 32768), (8, 131072), (1, 131072), (1, 1024), (32, 1024), (64, 1024),
                 (256, 1024)]  # fmt: skip
SPLITS = [1, 2, 4, 8, 16, 32, 64]
DECODE_BLOCKS = [(64, 4, 2), (64, 4, 3), (64, 4, 4), (128, 4, 2), (128, 8, 2), (128, 4, 3)]
# Many splits in the grid (as a graph sized for long context would launch) with a floor on
# tokens per split, so that short sequences use few of them and the other programs exit.
POLICY_SPLITS = [8, 16, 32, 64]
POLICY_MIN_SPLIT = [512, 2048]
POLICY_BLOCKS = [(64, 4, 3), (128, 4, 2)]
# (new rows, sequence length): a whole 32K prompt; the engine's chunks (2K by default, 16K
# with a larger budget) at the end of a 32K and of a 128K prompt.
PREFILL_SHAPES = [(32768, 32768), (2048, 32768), (16384, 32768), (2048, 131072), (16384, 131072)]
PREFILL_CONFIGS = [PrefillConfig(*c) for c in [
    (256, 64, 8, 3), (256, 64, 8, 2), (256, 128, 8, 2), (128, 128, 8, 3), (128, 128, 8, 2),
    (128, 64, 4, 3), (128, 128, 4, 3), (128, 64, 8, 4), (64, 128, 4, 3),
    (256, 64, 8, 3, True), (128, 128, 8, 3, True), (128, 64, 4, 3, True), (128, 128, 8, 2, True),
]]  # fmt: skip


def decode_row(shapes: DecodeShapes, batch: int, ctx: int, cfg: DecodeConfig | None) -> dict:
    kv_bytes = 2 * batch * ctx * HKV * HEAD_DIM * DTYPE.itemsize
    ms = shapes.graph_ms(batch, ctx, kv_bytes, cfg, WIDTH)
    total = kv_bytes + 2 * batch * HQ * HEAD_DIM * DTYPE.itemsize + batch * ctx // PAGE * 4
    return {"batch": batch, "ctx": ctx, "us": ms * 1e3, "gbs": total / ms / 1e6,
            "config": None if cfg is None else vars(cfg)}  # fmt: skip


def sweep_decode(shapes: DecodeShapes, copy_gbs: float, quick: bool) -> list[dict]:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    blocks = DECODE_BLOCKS[:2] + DECODE_BLOCKS[3:4] if quick else DECODE_BLOCKS
    for batch, ctx in DECODE_SHAPES:
        default = decode_row(shapes, batch, ctx, None)
        default.update(default=True, splits=num_decode_splits(batch, HKV, WIDTH * PAGE, sms))
        rows.append(default)
        best = default
        grid = itertools.product(SPLITS, blocks, [0])
        policy = itertools.product(POLICY_SPLITS, POLICY_BLOCKS, POLICY_MIN_SPLIT)
        for splits, (block_n, warps, stages), min_split in itertools.chain(grid, policy):
            too_short = not min_split and splits > 1 and ctx // splits < block_n
            if batch * HKV * splits > (128 if min_split else 64) * sms or too_short:
                continue
            cfg = DecodeConfig(block_n, warps, stages, splits, min_split)
            row = try_run(decode_row, shapes, batch, ctx, cfg)
            row.update(batch=batch, ctx=ctx, splits=splits, config=vars(cfg))
            rows.append(row)
            if row["gbs"] > best["gbs"]:
                best = row
        for r in (default, best):
            r["of_copy"] = r["gbs"] / copy_gbs
        print(f"decode B={batch} ctx={ctx}: default (splits {default['splits']}) "
              f"{default['us']:.1f} us {100 * default['of_copy']:.0f}%; best {best['config']} "
              f"{best['us']:.1f} us {100 * best['of_copy']:.0f}% of copy", flush=True)  # fmt: skip
    for r in rows:
        r.setdefault("of_copy", r["gbs"] / copy_gbs)
    return rows


def attention_flops(qlen: int, seq_len: int) -> float:
    """Causal: row j of the chunk sees ``seq_len - qlen + j + 1`` keys; 4 FLOPs per (q, k, d)."""
    ctx = seq_len - qlen
    pairs = qlen * ctx + qlen * (qlen + 1) / 2
    return 4 * HQ * HEAD_DIM * pairs


def prefill_ms(qlen: int, seq_len: int, cfg: PrefillConfig | None, reps: int = 5) -> float:
    q, kv_cache, qsl, seq_lens, tables = prefill_inputs(seq_len, qlen)

    def call() -> torch.Tensor:
        return paged_prefill_attention(q, kv_cache, qsl, seq_lens, tables, qlen, SCALE, config=cfg)

    call()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def prefill_row(qlen: int, seq_len: int, cfg: PrefillConfig | None, mm_tflops: float) -> dict:
    ms = prefill_ms(qlen, seq_len, cfg)
    tflops = attention_flops(qlen, seq_len) / ms / 1e9
    used = cfg or default_prefill_config(HEAD_DIM, DTYPE)
    return {"qlen": qlen, "seq_len": seq_len, "ms": ms, "tflops": tflops,
            "of_matmul": tflops / mm_tflops, "config": vars(used)}  # fmt: skip


def sweep_prefill(mm_tflops: float, quick: bool) -> list[dict]:
    rows = []
    configs = PREFILL_CONFIGS[:5] + PREFILL_CONFIGS[-4:] if quick else PREFILL_CONFIGS
    for qlen, seq_len in PREFILL_SHAPES:
        best = None
        for cfg in configs:
            row = try_run(prefill_row, qlen, seq_len, cfg, mm_tflops)
            row.update(qlen=qlen, seq_len=seq_len, config=vars(cfg))
            rows.append(row)
            if "error" not in row and (best is None or row["tflops"] > best["tflops"]):
                best = row
        assert best is not None
        print(f"prefill q={qlen} L={seq_len}: best {best['config']} {best['ms']:.2f} ms "
              f"{best['tflops']:.0f} TFLOP/s ({100 * best['of_matmul']:.0f}% of matmul)",
              flush=True)  # fmt: skip
    return rows


# A short chunk behind a long context (the scheduler's chunk_attention_budget cuts chunks to
# this beside decodes): key splits (0: the default from shapes) by row-block tile.
CHUNK_SHAPES = [(256, 131072), (512, 131072), (1024, 131072), (2048, 131072), (256, 32768),
                (1024, 32768)]  # fmt: skip
CHUNK_SPLITS = [1, 0, 2, 4, 8, 16]
CHUNK_TILES = [(256, 64, 8, 3), (128, 64, 4, 3), (128, 128, 8, 2)]


def sweep_chunks(mm_tflops: float) -> list[dict]:
    rows = []
    for qlen, seq_len in CHUNK_SHAPES:
        for tile, splits in itertools.product(CHUNK_TILES, CHUNK_SPLITS):
            cfg = PrefillConfig(*tile, kv_splits=splits)
            row = try_run(prefill_row, qlen, seq_len, cfg, mm_tflops)
            row.update(qlen=qlen, seq_len=seq_len, config=vars(cfg))
            if splits == 0:
                row["kv_splits_chosen"] = num_prefill_kv_splits(
                    -(-qlen // tile[0]) * HQ, seq_len, qlen, HQ, HEAD_DIM,
                    sm_count(torch.device("cuda")),
                )  # fmt: skip
            rows.append(row)
            ms = row.get("ms", float("nan"))
            print(f"chunk q={qlen} L={seq_len} tile={tile} splits={splits}: {ms:.2f} ms "
                  f"{row['tflops']:.0f} TFLOP/s", flush=True)  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="fewer tile configs")
    ap.add_argument("--parts", default="decode,prefill")
    args = ap.parse_args()
    t0 = time.perf_counter()
    copy_gbs, mm_tflops = copy_bandwidth_gbs(), matmul_tflops()
    print(f"copy {copy_gbs:.0f} GB/s, bf16 matmul {mm_tflops:.0f} TFLOP/s", flush=True)
    record = {
        **stamp("long_context_sweep"),
        "copy_gbs": copy_gbs,
        "matmul_tflops": mm_tflops,
        "width": WIDTH,
        "shape": {"hq": HQ, "hkv": HKV, "head_dim": HEAD_DIM, "page": PAGE},
    }
    parts = set(args.parts.split(","))
    if "decode" in parts:
        record["decode"] = sweep_decode(DecodeShapes(), copy_gbs, args.quick)
        write_json(args.out, record, indent=1)
        torch.cuda.empty_cache()
    if "prefill" in parts:
        record["prefill"] = sweep_prefill(mm_tflops, args.quick)
        write_json(args.out, record, indent=1)
    if "chunks" in parts:
        record["chunks"] = sweep_chunks(mm_tflops)
    record["wall_s"] = time.perf_counter() - t0
    write_json(args.out, record, indent=1)
    print(f"wrote {args.out} in {record['wall_s']:.0f} s ({math.ceil(record['wall_s'] / 60)} min)")


if __name__ == "__main__":
    main()
