"""MXFP4 weights decoded by Triton's own e2m1 upcast (``tl.dot_scaled``) against kvserve's FP4
MMA kernel (``kvserve/kernels/fp4_gemm.py``, W decoded in registers), at a decode step of 64
rows on Llama-3-8B's projections.

Why: compiled for sm_90, the shipped kernel's K loop writes each decoded W tile to shared memory
and reads it back in the MMA's operand layout (STS / BAR / LDSM rounds) and waits after every
MMA; ``dot_scaled``'s upcast reads the code bytes from shared memory straight into that layout
and issues a K step's MMAs back to back. Its x operand is read two ways: as x [M, K] transposed
in the kernel (Triton then loads it through registers every step, unpipelined, and stores it
to shared memory element by element) or from a transposed copy x^T [K, M] (pipelined like W).
K is split with an fp32 atomic add (a timing stand-in for the shipped kernel's deterministic
reduction). Timed as one CUDA graph cycling through >= 256 MB of distinct weights.

    python -m benchmarks.fp4_scaled_dot --out-dir $OUT
"""

from __future__ import annotations

import argparse
import itertools
from typing import Any

import torch

from benchmarks.common import write_result
from benchmarks.skinny_gemm import graph_us, rel_err
from kvserve.kernels._triton import jit, tl
from kvserve.kernels.fp4_gemm import default_config, fp4_linear
from kvserve.kernels.fp4_reference import MXFP4_GROUP

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
ROWS = 64
SPAN_BYTES = 256 << 20
# (block_n, block_k, num_warps, num_stages)
TILES = ((128, 128, 8, 4), (128, 256, 8, 3), (64, 128, 4, 3), (64, 256, 4, 3))
SPLITS = (1, 2, 4)
_GROUP = tl.constexpr(MXFP4_GROUP)


@jit
def _scaled_dot_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr, M, K, stride_x, stride_wn, stride_sn, stride_om, k_per_split,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, X_T: tl.constexpr,
):  # fmt: skip
    """out[M, N] (fp32, zeroed) += x @ W.T over this program's K range; x is [M, K] or, with
    X_T, x^T [K, M]."""
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    k_start = tl.program_id(2) * k_per_split
    rb = k_start // 2 + tl.arange(0, BLOCK_K // 2)
    rk = k_start + tl.arange(0, BLOCK_K)
    rg = k_start // _GROUP + tl.arange(0, BLOCK_K // _GROUP)
    w_ptrs = w_ptr + rn[:, None].to(tl.int64) * stride_wn + rb[None, :]
    s_ptrs = s_ptr + rn[:, None].to(tl.int64) * stride_sn + rg[None, :]
    if X_T:
        x_ptrs = x_ptr + rk[:, None] * stride_x + rm[None, :]
    else:
        x_ptrs = x_ptr + (rm % M)[:, None] * stride_x + rk[None, :]
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for _ in range(k_start, tl.minimum(k_start + k_per_split, K), BLOCK_K):
        p = tl.load(w_ptrs)
        s = tl.load(s_ptrs)
        x = tl.load(x_ptrs)
        if X_T:
            acc = tl.dot_scaled(p, s, "e2m1", x, None, "bf16", acc, fast_math=True)
            x_ptrs += BLOCK_K * stride_x
        else:
            acc = tl.dot_scaled(p, s, "e2m1", tl.trans(x), None, "bf16", acc, fast_math=True)
            x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K // 2
        s_ptrs += BLOCK_K // _GROUP
    out = out_ptr + rm[None, :] * stride_om + rn[:, None]
    tl.atomic_add(out, acc, mask=(rm < M)[None, :], sem="relaxed")


def scaled_dot_linear(
    x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, tile: tuple, split: int,
    x_t: bool,
) -> torch.Tensor:  # fmt: skip
    """x [M, K] (or, ``x_t``, x^T [K, M]) @ W.T in fp32."""
    block_n, block_k, warps, stages = tile
    m, k = x.shape[::-1] if x_t else x.shape
    n = packed.shape[0]
    out = torch.zeros(m, n, dtype=torch.float32, device=x.device)
    k_per_split = -(-k // block_k // split) * block_k
    grid = (1, n // block_n, -(-k // k_per_split))
    _scaled_dot_kernel[grid](
        x, packed, scales, out, m, k, x.stride(0), packed.stride(0), scales.stride(0),
        out.stride(0), k_per_split, BLOCK_N=block_n, BLOCK_M=ROWS, BLOCK_K=block_k, X_T=x_t,
        num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out


def measure_shape(name: str, n: int, k: int, replays: int) -> dict[str, Any]:
    layers = max(2, -(-SPAN_BYTES // (n * k // 2)))
    weights = [
        (torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device="cuda"),
         torch.randint(118, 124, (n, k // MXFP4_GROUP), dtype=torch.uint8, device="cuda"))
        for _ in range(layers)
    ]  # fmt: skip
    x = torch.randn(ROWS, k, dtype=torch.bfloat16, device="cuda")
    x_t = x.t().contiguous()
    ref = fp4_linear(x, *weights[0]).float()
    row: dict[str, Any] = {"shape": name, "n": n, "k": k, "layers": layers}
    us, _ = graph_us(lambda xin, w: fp4_linear(xin, *w), [x] * layers, weights, replays)
    config = str(default_config(ROWS, n, k, group=MXFP4_GROUP))
    row["kvserve_default"] = {"config": config, "us": us}
    row["transpose_copy_us"], _ = graph_us(
        lambda xin, w: xin.t().contiguous(), [x] * layers, weights, replays
    )
    for tile, split, transposed in itertools.product(TILES, SPLITS, (False, True)):

        def op(xin: torch.Tensor, w: tuple, tile=tile, split=split, t=transposed) -> torch.Tensor:  # noqa: ANN001
            return scaled_dot_linear(xin, *w, tile, split, t)

        us, out = graph_us(op, [x_t if transposed else x] * layers, weights, replays)
        row[f"{tile} split {split} x_t {transposed}"] = {"us": us, "rel_err": rel_err(out, ref)}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--replays", type=int, default=10)
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    for name in args.shapes.split(","):
        row = measure_shape(name, *SHAPES[name], args.replays)
        best = min(
            (v["us"], key) for key, v in row.items() if isinstance(v, dict) and "rel_err" in v
        )
        kvserve, copy = row["kvserve_default"]["us"], row["transpose_copy_us"]
        print(f"{name}: kvserve {kvserve:.1f} us, best scaled-dot {best[0]:.1f} us ({best[1]}), "
              f"x^T copy {copy:.1f} us")  # fmt: skip
        rows.append(row)
    print(
        f"wrote {write_result('fp4_scaled_dot', {'rows_of_x': ROWS, 'shapes': rows}, args.out_dir)}"
    )


if __name__ == "__main__":
    main()
