"""The word GEMV (``word_gemv.py``) built for sm_90 as each weight format launches it on the
GPU, its inline PTX included (the interpreter runs the kernel without it): FP8 per channel with
fp32 and f16 sums, FP8 128 x 128 blocks, 16-bit weights, NVFP4 and MXFP4; one to four rows,
the gated gate/up mode, split K, and the experts' slots with and without the token sum."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

pytest.importorskip("triton")

from triton_target import stack_bytes  # noqa: E402

from kvserve.kernels.fp4_reference import MXFP4_GROUP, NVFP4_GROUP  # noqa: E402
from kvserve.kernels.fused_moe import TokenSum  # noqa: E402
from kvserve.kernels.word_gemv import (  # noqa: E402
    FP4_PER_WORD,
    GemvConfig,
    fp4_gemv_config,
    fp8_gemv,
    half_gemv,
    launch_word_gemv,
    moe_gemv,
)

FP8 = torch.float8_e4m3fn
N, K = 512, 1024
KINDS = ["fp8-channel", "fp8-channel-f32-sums", "fp8-block", "bf16", "nvfp4", "mxfp4"]


def _fp4(kind: str, n: int, k: int, experts: int = 0) -> tuple[torch.Tensor, ...]:
    """Codes, block scales (e4m3 for NVFP4, E8M0 bytes for MXFP4) and NVFP4's row scales."""
    lead = (experts,) if experts else ()
    group = NVFP4_GROUP if kind == "nvfp4" else MXFP4_GROUP
    packed = torch.zeros(*lead, n, k // 2, dtype=torch.uint8)
    scale_dtype = FP8 if kind == "nvfp4" else torch.uint8
    block = torch.zeros(*lead, n, k // group, dtype=scale_dtype)
    rows = torch.ones(*lead, n) if kind == "nvfp4" else None
    return packed, block, rows


def _dense(kind: str, x: torch.Tensor, gated: bool, split_k: int) -> None:
    """One launch of ``kind``'s dense GEMV on x."""
    rows = x.shape[0]
    if kind in ("nvfp4", "mxfp4"):
        group = NVFP4_GROUP if kind == "nvfp4" else MXFP4_GROUP
        packed, block, row_scale = _fp4(kind, N, K)
        cfg = fp4_gemv_config(N, K // FP4_PER_WORD, rows, 132, group)
        cfg = replace(cfg, split_k=split_k)
        out = torch.empty(rows, N // 2 if gated else N, dtype=x.dtype)
        launch_word_gemv(x, packed, block, row_scale, None, out, cfg, group, pdl=True,
                         gated=gated)  # fmt: skip
    elif kind == "bf16":
        cfg = GemvConfig(64, 32, split_k)
        half_gemv(x, torch.zeros(N, K, dtype=x.dtype), config=cfg, pdl=True, gated=gated)
    else:
        block = (128, 128) if kind == "fp8-block" else None
        scale = torch.ones(N // 128, K // 128) if block else torch.ones(N)
        cfg = GemvConfig(64, 32, split_k, half_sums=kind != "fp8-channel-f32-sums")
        fp8_gemv(x, torch.zeros(N, K, dtype=FP8), scale, config=cfg, block=block, pdl=True,
                 gated=gated)  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [1, 2, 4])
@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
def test_the_dense_gemv_builds_for_sm90_without_spills(
    compile_only: list, kind: str, rows: int, gated: bool
) -> None:
    _dense(kind, torch.zeros(rows, K, dtype=torch.bfloat16), gated, split_k=1)
    assert stack_bytes(compile_only) == [0] * len(compile_only)


@pytest.mark.parametrize("kind", KINDS)
def test_the_split_k_gemv_builds_for_sm90_without_spills(compile_only: list, kind: str) -> None:
    _dense(kind, torch.zeros(1, K, dtype=torch.bfloat16), gated=False, split_k=4)
    assert stack_bytes(compile_only) == [0] * len(compile_only)


@pytest.mark.parametrize("kind", ["fp8-block", "bf16", "nvfp4", "mxfp4"])
@pytest.mark.parametrize("gemm", ["gate-up", "down-summed"])
def test_the_experts_gemv_builds_for_sm90_without_spills(
    compile_only: list, kind: str, gemm: str
) -> None:
    """A decode step's experts: the gate/up GEMM (x row per token, gated) and the down GEMM of
    one slot per row, router-weighted, each token's rows summed in the epilogue."""
    experts, tokens, top_k = 8, 2, 4
    inter, hidden = 256, 512
    gate_up = gemm == "gate-up"
    n, k = (2 * inter, hidden) if gate_up else (hidden, inter)
    slots = tokens * top_k
    ids = torch.arange(slots, dtype=torch.int32) % experts
    x = torch.zeros(tokens if gate_up else slots, k, dtype=torch.bfloat16)
    route = (ids, top_k, None if gate_up else torch.ones(slots))
    token_sum = None if gate_up else TokenSum()
    if kind in ("nvfp4", "mxfp4"):
        group = NVFP4_GROUP if kind == "nvfp4" else MXFP4_GROUP
        packed, block, rows = _fp4(kind, n, k, experts)
        moe_gemv(x, packed, (block, rows), {}, group, route, token_sum, pdl=True, gated=gate_up)
    elif kind == "bf16":
        weight = torch.zeros(experts, n, k, dtype=torch.bfloat16).view(torch.uint8)
        moe_gemv(x, weight, (None, None), {}, 8, route, token_sum, pdl=True, half_weights=True,
                 gated=gate_up)  # fmt: skip
    else:
        weight = torch.zeros(experts, n, k, dtype=FP8).view(torch.uint8)
        scales = torch.ones(experts, n // 128, k // 128)
        moe_gemv(x, weight, (scales, None), {}, 8, route, token_sum, pdl=True,
                 fp8_block_rows=128, gated=gate_up)  # fmt: skip
    assert stack_bytes(compile_only) == [0] * len(compile_only)
