"""An FP4 weight layout whose words the MMA can take straight from registers, against kvserve's
FP4 MMA kernel (``kvserve/kernels/fp4_gemm.py``), at decode steps of 64 and 32 rows on
Llama-3-8B's projections. A benchmark of a layout kvserve does not ship: it decides whether the
layout is worth moving every FP4 kernel to.

The layout ("planes"): in each 128-wide K step of a row, word w (of 16) holds at nibble i the
code of K index 16 i + w (the shipped words hold K index 8 w + i). Nibble i of a tile's words
is then a [BLOCK_N, 16] tile of K-contiguous codes ("plane i"), decoded elementwise from the
words as loaded, and its dot takes x's columns 16 i .. 16 i + 15: eight dots of K = 16 a step.

Why: compiled for sm_90 at 64 rows, the shipped kernel writes each decoded W tile to shared
memory and reads it back in the MMA's operand layout (the decode's joins leave it in another),
behind 9-11 barriers a step. With planes nothing is joined: the words are read from shared
memory into the operand layout (LDS.64) and decoded there, and a step has 2 barriers and no
STS / LDSM (``python -m benchmarks.fp4_planes --sass``, no GPU needed). Scales: a plane is one
NVFP4 group (an MXFP4 group is two planes), so its scale is one per row.
K is split with an fp32 atomic add (a timing stand-in for the shipped kernel's deterministic
reduction). Timed as one CUDA graph cycling through >= 256 MB of distinct weights.

    python -m benchmarks.fp4_planes --out-dir $OUT
"""

from __future__ import annotations

import argparse
import itertools
from typing import Any

import torch

from benchmarks.common import write_result
from kvserve.kernels._triton import jit, tl
from kvserve.kernels.fp4_gemm import default_config, fp4_linear
from kvserve.kernels.fp4_reference import MXFP4_GROUP, NVFP4_GROUP
from kvserve.kernels.word_decode import fp4_word_to_halves

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
ROWS = (64, 32)
STEP = 128  # K a step: 16 words of 8 codes
PLANE = 16  # K of one plane (one dot)
SPAN_BYTES = 256 << 20
# (block_n, num_warps, num_stages)
TILES = ((128, 8, 4), (128, 8, 3), (64, 4, 3), (64, 4, 4))
SPLITS = (1, 2, 4, 6)
# the opcodes of the shipped kernel's shared-memory round trip and MMA waits
_ROUND_TRIP = ("STS", "LDSM", "BAR", "WARPGROUP", "HGMMA", "LDS", "LDG")


@jit
def _plane_scale(s_words, i: tl.constexpr, GROUP: tl.constexpr):
    """Plane i's block scale, fp32 times 2**6 (the decoded codes' unit), from the step's scale
    bytes as int32 words: NVFP4 (s_lo, s_hi) of [BLOCK_N] (planes 0-3, 4-7), MXFP4 one word."""
    if GROUP == 16:
        word = s_words[i // 4]
        byte = (word >> (8 * (i % 4))) & 0xFF
        return byte.to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32) * 64.0
    else:
        byte = (s_words[0] >> (8 * (i // 2))) & 0xFF
        return ((byte + 6) << 23).to(tl.float32, bitcast=True)


@jit
def _planes_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr, M, K, stride_xm, stride_wn, stride_sn, stride_om, k_per_split,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, GROUP: tl.constexpr, DIRECT: tl.constexpr,
):  # fmt: skip
    """out[M, N] = x @ W.T over this program's K range (DIRECT: stored in x's dtype; else fp32
    added into a zeroed out). w_ptr: int32 words [N, K / 8] in planes; s_ptr: the block scale
    bytes as int32 words [N, K / GROUP / 4]."""
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    k_start = tl.multiple_of(tl.program_id(2) * k_per_split, 128)
    r16 = tl.arange(0, 16)
    rows = rn[:, None].to(tl.int64)
    w_ptrs = w_ptr + rows * stride_wn + (k_start // 8 + r16)[None, :]
    SCALE_WORDS: tl.constexpr = 128 // GROUP // 4
    s_ptrs = s_ptr + rows * stride_sn + (k_start // GROUP // 4 + tl.arange(0, SCALE_WORDS))[None, :]
    x_ptrs = x_ptr + (rm % M).to(tl.int64)[:, None] * stride_xm + (k_start + r16)[None, :]
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for _ in range(k_start, tl.minimum(k_start + k_per_split, K), 128):
        q = tl.load(w_ptrs)
        s = tl.load(s_ptrs)
        if SCALE_WORDS == 2:  # noqa: SIM108 - a constexpr branch
            s_words = tl.split(s)
        else:
            s_words = (tl.reshape(s, (BLOCK_N,)),)
        codes = fp4_word_to_halves(q)  # plane i = nibble i, f16 worth code * 2**-6
        for i in tl.static_range(8):
            x_i = tl.load(x_ptrs + 16 * i)
            scale = _plane_scale(s_words, i, GROUP)
            w_i = (codes[i].to(tl.float32) * scale[:, None]).to(x_ptr.dtype.element_ty)
            acc = tl.dot(w_i, tl.trans(x_i), acc)
        w_ptrs += 16
        s_ptrs += SCALE_WORDS
        x_ptrs += 128
    out = out_ptr + rm[None, :] * stride_om + rn[:, None]
    if DIRECT:
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(rm < M)[None, :])
    else:
        tl.atomic_add(out, acc, mask=(rm < M)[None, :], sem="relaxed")


def to_planes(packed: torch.Tensor) -> torch.Tensor:
    """Packed codes uint8 [N, K / 2] (code 2b in byte b's low nibble) -> int32 words [N, K / 8]
    in planes: word w of step c holds at nibble i the code of K index 128 c + 16 i + w."""
    n, k = packed.shape[0], packed.shape[1] * 2
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(n, k // STEP, 8, 16)
    codes = codes.transpose(2, 3).to(torch.int32)  # [n, step, w, i]
    shifts = torch.arange(0, 32, 4, device=packed.device, dtype=torch.int32)
    return (codes << shifts).sum(dim=-1, dtype=torch.int64).to(torch.int32).reshape(n, k // 8)


def planes_linear(
    x: torch.Tensor, words: torch.Tensor, scales: torch.Tensor, tile: tuple, split: int
) -> torch.Tensor:
    """x [M, K] @ W.T for W in planes (``to_planes``) and its block scales uint8 [N, K / g]."""
    block_n, warps, stages = tile
    m, k = x.shape
    n, group = words.shape[0], k // scales.shape[1]
    k_per_split = -(-k // STEP // split) * STEP
    splits = -(-k // k_per_split)
    out = torch.empty if splits == 1 else torch.zeros
    out = out(m, n, dtype=x.dtype if splits == 1 else torch.float32, device=x.device)
    block_m = 32 if m <= 32 else 64
    s_words = scales.view(torch.int32)
    grid = (-(-m // block_m), n // block_n, splits)
    _planes_kernel[grid](
        x, words, s_words, out, m, k, x.stride(0), words.stride(0), s_words.stride(0),
        out.stride(0), k_per_split, BLOCK_N=block_n, BLOCK_M=block_m, GROUP=group,
        DIRECT=splits == 1, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out


def measure_shape(fmt: str, rows: int, name: str, replays: int) -> dict[str, Any]:
    from benchmarks.fp4_gemm import random_fp4
    from benchmarks.skinny_gemm import graph_us, rel_err

    n, k = SHAPES[name]
    group = NVFP4_GROUP if fmt == "nvfp4" else MXFP4_GROUP
    layers = max(2, -(-SPAN_BYTES // (n * k // 2)))
    weights = [random_fp4(fmt, n, k) for _ in range(layers)]
    planes = [(to_planes(p), s) for p, s, _ in weights]  # NVFP4's row scales are ones
    x = torch.randn(rows, k, dtype=torch.bfloat16, device="cuda")
    ref = fp4_linear(x, *weights[0]).float()
    row: dict[str, Any] = {"format": fmt, "rows": rows, "shape": name, "n": n, "k": k}
    us, _ = graph_us(lambda xin, w: fp4_linear(xin, *w), [x] * layers, weights, replays)
    row["kvserve_default"] = {"config": str(default_config(rows, n, k, group=group)), "us": us}
    for tile, split in itertools.product(TILES, SPLITS):

        def op(xin: torch.Tensor, w: tuple, tile=tile, split=split) -> torch.Tensor:  # noqa: ANN001
            return planes_linear(xin, *w, tile, split)

        err = rel_err(op(x, planes[0]), ref)  # compiles outside the capture
        us, _ = graph_us(op, [x] * layers, planes, replays)
        row[f"{tile} split {split}"] = {"us": us, "rel_err": err}
    return row


def check_layout() -> None:
    """to_planes against the codes it moves, on the CPU."""
    packed = torch.randint(0, 256, (3, 128), dtype=torch.uint8)
    codes = torch.stack((packed & 0xF, packed >> 4), -1).reshape(3, 256)
    words = to_planes(packed)
    for c, w, i in itertools.product(range(2), range(16), range(8)):
        got = (words[:, 16 * c + w] >> (4 * i)) & 0xF
        assert torch.equal(got, codes[:, 128 * c + 16 * i + w].to(torch.int32)), (c, w, i)


def sass_summaries(
    tiles: tuple = TILES[::2], groups: tuple = (NVFP4_GROUP, MXFP4_GROUP)
) -> list[dict[str, Any]]:
    """The sm_90 K loop of the planes kernel at 64 rows (``benchmarks.lowbit_sass``'s
    counting), compiled without a GPU."""
    from benchmarks.lowbit_sass import _compile, describe

    pointers = {"x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*i32", "out_ptr": "*bf16"}
    ints = ["M", "K", "stride_xm", "stride_wn", "stride_sn", "stride_om", "k_per_split"]
    rows = []
    for (block_n, warps, stages), group in itertools.product(tiles, groups):
        constants = {"BLOCK_N": block_n, "BLOCK_M": 64, "GROUP": group, "DIRECT": True}
        options = {"num_warps": warps, "num_stages": stages}
        cubin = _compile(_planes_kernel, pointers, ints, constants, options)
        weights = block_n * STEP // (warps * 32)
        rows.append({"block_n": block_n, "num_warps": warps, "num_stages": stages,
                     "group": group, **describe(cubin, weights)})  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--sass", action="store_true", help="only the sm_90 loops (no GPU needed)")
    ap.add_argument("--formats", default="nvfp4,mxfp4")
    ap.add_argument("--rows", default=",".join(map(str, ROWS)))
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--replays", type=int, default=10)
    args = ap.parse_args()
    check_layout()
    if args.sass:
        rows = sass_summaries()
        for row in rows:
            ops = row["loop_opcodes"]
            print({k: row[k] for k in ("block_n", "num_warps", "group", "REG", "STACK")},
                  row["loop_instructions"], {k: ops.get(k, 0) for k in _ROUND_TRIP})  # fmt: skip
        print(f"wrote {write_result('fp4_planes_sass', {'loops': rows}, args.out_dir)}")
        return
    torch.manual_seed(0)
    results = []
    for fmt, rows, name in itertools.product(
        args.formats.split(","), map(int, args.rows.split(",")), args.shapes.split(",")
    ):
        row = measure_shape(fmt, rows, name, args.replays)
        timed = [(v["us"], key) for key, v in row.items() if isinstance(v, dict) and "rel_err" in v]
        us, best = min(timed)
        print(f"{fmt} {rows} rows {name}: kvserve {row['kvserve_default']['us']:.1f} us, "
              f"best planes {us:.1f} us ({best}, rel err {row[best]['rel_err']:.2g})")  # fmt: skip
        results.append(row)
    print(f"wrote {write_result('fp4_planes', {'shapes': results}, args.out_dir)}")


if __name__ == "__main__":
    main()
