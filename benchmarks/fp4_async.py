"""The asynchronous-MMA FP4 GEMM (``kvserve/kernels/fp4_async_gemm.py``, Gluon) against kvserve's
shipped FP4 MMA kernel (``fp4_gemm.py``) at decode steps of 64 and 32 rows on Llama-3-8B's
projections, after a correctness sweep against the shipped kernel over uneven shapes.
Timed as one CUDA graph cycling through >= 256 MB of distinct weights.

    python -m benchmarks.fp4_async --out-dir $OUT
"""

from __future__ import annotations

import argparse
import itertools
from typing import Any

import torch

from benchmarks.common import write_result
from benchmarks.fp4_gemm import random_fp4
from benchmarks.skinny_gemm import graph_us, rel_err
from kvserve.kernels.fp4_async_gemm import fp4_async_linear
from kvserve.kernels.fp4_gemm import default_config, fp4_linear
from kvserve.kernels.fp4_reference import MXFP4_GROUP, NVFP4_GROUP

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
SPAN_BYTES = 256 << 20
SPLITS = (1, 2, 4, 8)
STAGES = (4, 6)
WARPS = (8, 4)  # the correctness sweep's; timed at 8 (4 spills at 64 rows)
# (m, n, k): rows past a tile, N past a tile, odd step counts, one step
CHECK_SHAPES = ((64, 4096, 4096), (37, 1000, 384), (17, 200, 128), (64, 272, 1152), (5, 96, 640))
CHECK_TOL = 1e-2


def check(fmt: str) -> list[dict[str, Any]]:
    """The async kernel against the shipped one (both exact weights, fp32 sums), with split K,
    a row scale (NVFP4) and a bias."""
    rows = []
    configs = itertools.product(CHECK_SHAPES, (1, 3), WARPS[:1], STAGES)
    for (m, n, k), split, warps, stages in configs:
        packed, scales, row_scale = random_fp4(fmt, n, k)
        if row_scale is not None:
            row_scale = torch.rand(n, device="cuda") + 0.5
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        ref = fp4_linear(x, packed, scales, row_scale, bias)
        out = fp4_async_linear(
            x, packed, scales, row_scale, bias, split_k=split, num_warps=warps, stages=stages
        )
        err = rel_err(out, ref)
        rows.append({"format": fmt, "m": m, "n": n, "k": k, "split": split, "warps": warps,
                     "stages": stages,
                     "rel_err": err, "ok": err <= CHECK_TOL})  # fmt: skip
    return rows


def measure_shape(
    fmt: str, rows: int, name: str, replays: int, stages: tuple[int, ...] = STAGES
) -> dict[str, Any]:
    n, k = SHAPES[name]
    group = NVFP4_GROUP if fmt == "nvfp4" else MXFP4_GROUP
    layers = max(2, -(-SPAN_BYTES // (n * k // 2)))
    weights = [random_fp4(fmt, n, k) for _ in range(layers)]
    x = torch.randn(rows, k, dtype=torch.bfloat16, device="cuda")
    ref = fp4_linear(x, *weights[0]).float()
    row: dict[str, Any] = {"format": fmt, "rows": rows, "shape": name, "n": n, "k": k}
    us, _ = graph_us(lambda xin, w: fp4_linear(xin, *w), [x] * layers, weights, replays)
    row["kvserve_default"] = {"config": str(default_config(rows, n, k, group=group)), "us": us}
    for split, warps, slots in itertools.product(SPLITS, WARPS[:1], stages):

        def op(xin: torch.Tensor, w: tuple, cfg=(split, warps, slots)) -> torch.Tensor:  # noqa: ANN001
            return fp4_async_linear(xin, *w, split_k=cfg[0], num_warps=cfg[1], stages=cfg[2])

        err = rel_err(op(x, weights[0]), ref)  # compiles outside the capture
        us, _ = graph_us(op, [x] * layers, weights, replays)
        row[f"split {split} warps {warps} stages {slots}"] = {"us": us, "rel_err": err}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--formats", default="nvfp4,mxfp4")
    ap.add_argument("--rows", default="64,32")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--tag", default="")
    ap.add_argument("--stages", default=",".join(map(str, STAGES)), help="ring slots to time")
    args = ap.parse_args()
    torch.manual_seed(0)
    checks = [c for fmt in args.formats.split(",") for c in check(fmt)]
    bad = [c for c in checks if not c["ok"]]
    print(f"checks: {len(checks) - len(bad)} of {len(checks)} within {CHECK_TOL}; worst "
          f"{max(c['rel_err'] for c in checks):.3g}")  # fmt: skip
    for c in bad:
        print("  off:", c)
    results = []
    for fmt, rows, name in itertools.product(
        args.formats.split(","), map(int, args.rows.split(",")), args.shapes.split(",")
    ):
        stages = tuple(map(int, args.stages.split(",")))
        row = measure_shape(fmt, rows, name, args.replays, stages)
        timed = [(v["us"], key) for key, v in row.items() if isinstance(v, dict) and "rel_err" in v]
        us, best = min(timed)
        print(f"{fmt} {rows} rows {name}: kvserve {row['kvserve_default']['us']:.1f} us, "
              f"best async {us:.1f} us ({best}, rel err {row[best]['rel_err']:.2g})")  # fmt: skip
        results.append(row)
    name = "fp4_async" + (f"_{args.tag}" if args.tag else "")
    print(f"wrote {write_result(name, {'checks': checks, 'shapes': results}, args.out_dir)}")


if __name__ == "__main__":
    main()
