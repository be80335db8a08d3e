"""The FP4 MMA kernel (``fp4_gemm.py``) built for sm_90 at its decode tiles, the tile decoded
whole or by parity (``Fp4GemmConfig.even_odd``): no spills, and the parity loop issues each of
its two dots' HGMMAs back to back (one wait a dot) behind at most 4 barriers a K step, where the
whole-tile loop waits after every HGMMA behind 9-11 (what ``even_odd`` is there for)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

pytest.importorskip("triton")

from triton_target import stack_bytes  # noqa: E402

from benchmarks.kernel_spills import cuobjdump  # noqa: E402
from benchmarks.lowbit_sass import loop_opcodes  # noqa: E402
from kvserve.kernels.fp4_gemm import Fp4GemmConfig, _launch, default_config  # noqa: E402
from kvserve.kernels.fp4_reference import MXFP4_GROUP, NVFP4_GROUP  # noqa: E402

N, K = 1024, 4096


def _build(compile_only: list, cfg: Fp4GemmConfig, group: int, rows: int) -> None:
    x = torch.zeros(rows, K, dtype=torch.bfloat16)
    packed = torch.zeros(N, K // 2, dtype=torch.uint8)
    if group == MXFP4_GROUP:
        scales, row_scale = torch.zeros(N, K // group, dtype=torch.uint8), None
    else:
        scales, row_scale = torch.zeros(N, K // group, dtype=torch.float8_e4m3fn), torch.ones(N)
    out = torch.empty(rows, N, dtype=torch.bfloat16)
    _launch(x, packed, scales, row_scale, None, out, cfg, group)


@pytest.mark.parametrize("group", [NVFP4_GROUP, MXFP4_GROUP])
@pytest.mark.parametrize(
    ("rows", "cfg"),
    [
        (64, Fp4GemmConfig(128, 128, 64, num_warps=8, num_stages=4)),
        (64, Fp4GemmConfig(64, 128, 64, split_k=4, num_stages=3)),
        (32, Fp4GemmConfig(64, 128, 32, split_k=3)),
    ],
)
def test_the_parity_decode_chains_each_dots_mmas_on_sm90(
    compile_only: list, group: int, rows: int, cfg: Fp4GemmConfig
) -> None:
    _build(compile_only, replace(cfg, even_odd=True), group, rows)
    assert stack_bytes(compile_only) == [0]
    ops = loop_opcodes(cuobjdump(compile_only[-1].asm["cubin"], "-sass"))
    assert ops["HGMMA"] == cfg.block_k // 16 * (cfg.block_n // 64) // (cfg.num_warps // 4)
    assert ops["WARPGROUP"] == 4  # an arrive and a wait for each of the two dots
    assert ops["BAR"] <= 4


@pytest.mark.parametrize("group", [NVFP4_GROUP, MXFP4_GROUP])
@pytest.mark.parametrize("rows", [16, 32, 64])
def test_the_default_tiles_build_for_sm90_without_spills(
    compile_only: list, group: int, rows: int
) -> None:
    _build(compile_only, default_config(rows, N, K, group=group), group, rows)
    assert stack_bytes(compile_only) == [0]
