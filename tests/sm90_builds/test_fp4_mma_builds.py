"""The FP4 MMA kernel (``fp4_gemm.py``) built for sm_90 at its default decode tiles (16, 32 and
64 rows of x, both formats): no spills."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from triton_target import stack_bytes  # noqa: E402

from kvserve.kernels.fp4_gemm import Fp4GemmConfig, _launch, default_config  # noqa: E402
from kvserve.kernels.fp4_reference import MXFP4_GROUP, NVFP4_GROUP  # noqa: E402

N, K = 1024, 4096


def _build(
    compile_only: list, cfg: Fp4GemmConfig, group: int, rows: int, pdl: bool = False
) -> None:
    x = torch.zeros(rows, K, dtype=torch.bfloat16)
    packed = torch.zeros(N, K // 2, dtype=torch.uint8)
    if group == MXFP4_GROUP:
        scales, row_scale = torch.zeros(N, K // group, dtype=torch.uint8), None
    else:
        scales, row_scale = torch.zeros(N, K // group, dtype=torch.float8_e4m3fn), torch.ones(N)
    out = torch.empty(rows, N, dtype=torch.bfloat16)
    _launch(x, packed, scales, row_scale, None, out, cfg, group, pdl)


@pytest.mark.parametrize("group", [NVFP4_GROUP, MXFP4_GROUP])
@pytest.mark.parametrize("rows", [16, 32, 64])
def test_the_default_tiles_build_for_sm90_without_spills(
    compile_only: list, group: int, rows: int
) -> None:
    _build(compile_only, default_config(rows, N, K, group=group), group, rows)
    assert stack_bytes(compile_only) == [0]


@pytest.mark.parametrize("rows", [16, 64])
def test_with_dependent_launch_it_waits_before_loading_x(compile_only: list, rows: int) -> None:
    """``pdl``: the wait comes before the K loop's first load of x (its prologue's), the
    release after the loop, before the split sum and the stores."""
    _build(compile_only, default_config(rows, N, K, group=NVFP4_GROUP), NVFP4_GROUP, rows, True)
    ptx = compile_only[0].asm["ptx"]
    wait, release = ptx.index("griddepcontrol.wait"), ptx.index("griddepcontrol.launch_dependents")
    assert wait < ptx.index("cp.async") and wait < release < ptx.index("st.global")
    assert stack_bytes(compile_only) == [0]
