"""Each rank's slice of a quantized weight and its scales dequantizes to that rank's slice of
the full dequantized weight: FP8 per-channel and 128x128 blocks, NVFP4 (group 16 + per-tensor
scale) and MXFP4 (group 32), column- (output rows) and row-parallel (input columns); a cut
through a block or group is refused."""

from __future__ import annotations

import pytest
import torch

from kvserve.distributed.sharding import column_shard, row_shard
from kvserve.errors import ConfigError
from kvserve.kernels.fp4_reference import dequantize_fp4
from kvserve.kernels.fp8_gemm import dequantize_fp8_weight
from kvserve.quant.fp8_weights import quantize_weight
from kvserve.quant.mxfp4 import quantize_mxfp4
from kvserve.quant.nvfp4 import quantize_nvfp4

N, K, TP = 512, 256, 2


def _weight() -> torch.Tensor:
    return torch.randn(N, K, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("layout", ["channel", "block"])
def test_fp8_scales_follow_rows_and_blocks(layout: str) -> None:
    block = (128, 128) if layout == "block" else None
    q, scale = quantize_weight(_weight(), layout, block)
    full = dequantize_fp8_weight(q, scale, block)
    for r in range(TP):
        rows = (r * N // TP, N // TP)
        cq, cs = (column_shard(t, N, *rows, "w") for t in (q, scale))
        assert torch.equal(dequantize_fp8_weight(cq, cs, block), full[rows[0] : sum(rows)])
        rq, rs = (row_shard(t, K, r, TP, "w") for t in (q, scale))
        cols = slice(r * K // TP, (r + 1) * K // TP)
        assert torch.equal(dequantize_fp8_weight(rq, rs, block), full[:, cols])


@pytest.mark.parametrize("quantize", [quantize_nvfp4, quantize_mxfp4])
def test_fp4_group_scales_follow_their_groups(quantize) -> None:  # noqa: ANN001
    w = quantize(_weight())
    full = dequantize_fp4(w.packed, w.block_scale, w.row_scale)
    for r in range(TP):
        a, n = r * N // TP, N // TP
        parts = [column_shard(t, N, a, n, "w") for t in w if t is not None]
        assert torch.equal(dequantize_fp4(*parts), full[a : a + n])
        parts = [row_shard(t, K, r, TP, "w") for t in w if t is not None]
        assert torch.equal(dequantize_fp4(*parts), full[:, r * K // TP : (r + 1) * K // TP])


def test_a_cut_through_a_block_or_group_is_refused() -> None:
    _, block_scale = quantize_weight(torch.randn(256, 256), "block", (128, 128))
    with pytest.raises(ConfigError, match="splits a block of 128"):
        column_shard(block_scale, 256, 64, 64, "o_proj.weight_scale")  # rows 64..128 of a block
    mx = quantize_mxfp4(torch.randn(64, 96))  # 3 groups of 32 per row: no even split
    with pytest.raises(ConfigError, match="splits a block of 32"):
        row_shard(mx.block_scale, 96, 0, 2, "down_proj.weight_scale")
