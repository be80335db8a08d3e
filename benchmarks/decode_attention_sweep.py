"""Paged decode attention as the engine's CUDA graphs run it: page tables as wide as the context
length allows (padded), one graph of many calls on rotating inputs. Sweeps the split count and
the block config per (batch, context) and prints the best, to set the defaults from.

    python -m benchmarks.decode_attention_sweep --width 512 --out $OUT/sweep.json
"""

from __future__ import annotations

import argparse
import itertools

import torch

from benchmarks.common import copy_bandwidth_gbs, stamp, write_json
from benchmarks.kernels_h200 import HKV, DecodeShapes, try_run
from kvserve.kernels.decode_attention import DecodeConfig, num_decode_splits

SHAPES = [(1, 1024), (8, 1024), (64, 1024), (256, 1024), (8, 4096), (64, 4096), (128, 4096)]
SPLITS = [1, 2, 3, 4, 8, 16, 32, 64]
BLOCKS = [(32, 4, 2), (64, 4, 2), (64, 4, 3), (64, 8, 3), (128, 4, 2), (128, 8, 2), (128, 8, 3)]


# Small batches, where a step's attention is latency-bound: how many splits a short context
# should fill (min_split_tokens) and whether the last split merges (no merge kernel); the long
# contexts check that a setting good at 1K does not cost batch 1 at 16K-128K.
SMALL_SHAPES = [(1, 1024), (1, 4096), (4, 1024), (8, 1024), (16, 1024), (1, 16384), (1, 131072)]
SMALL_CONFIGS = {
    "default": DecodeConfig(),
    "min256": DecodeConfig(min_split_tokens=256),
    "min256_fused": DecodeConfig(min_split_tokens=256, fused_merge=True, fused_merge_max_splits=64),
    "min128_fused": DecodeConfig(min_split_tokens=128, fused_merge=True, fused_merge_max_splits=64),
    "min512_fused": DecodeConfig(min_split_tokens=512, fused_merge=True, fused_merge_max_splits=64),
    "fused64": DecodeConfig(fused_merge=True, fused_merge_max_splits=64),
    "s16_fused": DecodeConfig(num_splits=16, fused_merge=True),
    "s8_fused": DecodeConfig(num_splits=8, fused_merge=True),
    "s4_fused": DecodeConfig(num_splits=4, fused_merge=True),
    # one tile a split (batch 1 up to 4K): no software pipeline, the tile loaded to registers
    "stages1": DecodeConfig(num_stages=1),
    "stages2": DecodeConfig(num_stages=2),
    "n128_min256_fused": DecodeConfig(
        block_n=128, num_stages=2, min_split_tokens=256, fused_merge=True,
        fused_merge_max_splits=64,
    ),
}  # fmt: skip


def sweep_small(decode: DecodeShapes, width: int, copy_gbs: float) -> list[dict]:
    rows = []
    for (batch, ctx), (name, cfg) in itertools.product(SMALL_SHAPES, SMALL_CONFIGS.items()):
        row = try_run(decode.run, batch, ctx, cfg, width)
        row.update(name=name, config=vars(cfg), of_copy=row["gbs"] / copy_gbs)
        rows.append(row)
        if "error" in row:
            print(f"B={batch} ctx={ctx} {name}: {row['error']}", flush=True)
            continue
        print(f"B={batch} ctx={ctx} {name}: {row['graph_us']:.1f} us", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=512, help="page-table columns (8K ctx / 16)")
    ap.add_argument("--small", action="store_true", help="only the small-batch settings")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    copy_gbs = copy_bandwidth_gbs()
    if args.small:
        rows = sweep_small(DecodeShapes(), args.width, copy_gbs)
        record = {**stamp("decode_attention_sweep_small"), "copy_gbs": copy_gbs,
                  "width": args.width, "rows": rows}  # fmt: skip
        write_json(args.out, record, indent=1)
        return
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    decode = DecodeShapes()
    rows = []
    for batch, ctx in SHAPES:
        default = num_decode_splits(batch, HKV, args.width * 16, sms)
        best = None
        for splits, (block_n, warps, stages) in itertools.product(SPLITS, BLOCKS):
            if splits > 1 and ctx // splits < block_n:
                continue
            cfg = DecodeConfig(block_n, warps, stages, splits)
            row = try_run(decode.run, batch, ctx, cfg, args.width)
            row.update(config=vars(cfg), default_splits=default, of_copy=row["gbs"] / copy_gbs)
            rows.append(row)
            if "error" not in row and (best is None or row["gbs"] > best["gbs"]):
                best = row
        base = try_run(decode.run, batch, ctx, None, args.width)
        print(f"B={batch} ctx={ctx}: default (splits {default}) {base['graph_us']:.1f} us "
              f"{base['gbs']:.0f} GB/s; best {best['config']} {best['graph_us']:.1f} us "
              f"{best['gbs']:.0f} GB/s ({100 * best['of_copy']:.0f}% of copy)",
              flush=True)  # fmt: skip
    record = {**stamp("decode_attention_sweep"), "copy_gbs": copy_gbs, "width": args.width,
              "rows": rows}  # fmt: skip
    write_json(args.out, record, indent=1)


if __name__ == "__main__":
    main()
