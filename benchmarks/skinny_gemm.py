"""Decode-shaped GEMMs (few rows, a large weight) against the copy ceiling of the same run.

A decode step's linear layers read each weight once, so their floor is weight bytes / bandwidth.
For the Llama-3-8B projections at M = 1..256 rows this times cuBLAS through ``F.linear`` (weight
stored [N, K], as the model keeps it) and through ``x @ w`` on a [K, N] copy, and reports the
share of the copy ceiling (bytes read + written per second) that the weight read reaches.

    PYTHONPATH=. python3 benchmarks/skinny_gemm.py --out-dir $OUT
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F
from ceilings import copy_bandwidth_gbs, median_ms
from results_io import write_result

# name: (N, K) of Llama-3-8B's fused projections
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
ROWS = [1, 8, 32, 64, 128, 256]


def time_shape(n: int, k: int, m: int, copy_gbs: float) -> dict:
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") / k**0.5
    w_kn = w.t().contiguous()
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    floor_us = (w.numel() * 2) / (copy_gbs * 1e3)
    row = {"N": n, "K": k, "M": m, "floor_us": floor_us}
    for name, fn in (("linear_nk", lambda: F.linear(x, w)), ("matmul_kn", lambda: x @ w_kn)):
        us = median_ms(fn) * 1e3
        row[f"{name}_us"] = us
        row[f"{name}_share"] = floor_us / us
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args()
    copy_gbs = copy_bandwidth_gbs()
    rows = []
    for name, (n, k) in SHAPES.items():
        for m in ROWS:
            row = {"shape": name, **time_shape(n, k, m, copy_gbs)}
            rows.append(row)
            print(f"{name:8s} M={m:4d}: floor {row['floor_us']:6.1f} us, "
                  f"F.linear {row['linear_nk_us']:6.1f} us ({100 * row['linear_nk_share']:.0f}%), "
                  f"x@w[K,N] {row['matmul_kn_us']:6.1f} us ({100 * row['matmul_kn_share']:.0f}%)",
                  flush=True)  # fmt: skip
    out = None if args.out_dir is None else Path(args.out_dir)
    print(write_result("skinny_gemm", {"copy_GBps": copy_gbs, "rows": rows}, out))


if __name__ == "__main__":
    main()
