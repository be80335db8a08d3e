"""The FP8 activation fusions' kernels (the RMSNorm writing e4m3, the SiLU-mul folded into x's
quantization) and the FP8 tensor-core GEMM they feed, built for sm_90 through their wrappers."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

pytest.importorskip("triton")

from triton_target import stack_bytes  # noqa: E402

# (hidden, scheme): 128-column groups where the row is whole groups (gpt-oss's 2880 is not)
NORM_CASES = [
    (hidden, scheme)
    for hidden in (4096, 5120, 2880)
    for scheme in ("per-token", "group-128", "static")
    if scheme != "group-128" or hidden % 128 == 0
]


@pytest.mark.parametrize(("hidden", "scheme"), NORM_CASES)
@pytest.mark.parametrize("residual", [False, True], ids=["first", "with-residual"])
def test_the_norm_writing_fp8_compiles_for_sm90_without_spills(
    compile_only: list, hidden: int, residual: bool, scheme: str
) -> None:
    from kvserve.kernels.rmsnorm_fp8 import rms_norm_fp8

    x = torch.zeros(4, hidden, dtype=torch.bfloat16)
    weight = torch.ones(hidden, dtype=torch.bfloat16)
    group = 128 if scheme == "group-128" else None
    static = torch.ones(1) if scheme == "static" else None
    rms_norm_fp8(x, x.clone() if residual else None, weight, 1e-6, group, static, pdl=True)
    assert stack_bytes(compile_only) == [0] * len(compile_only)
    # the row in the plain norm's layout: no shared-memory conversion for a store (8 KB at
    # 4096 columns when the e4m3 store took 16 values a thread), only the scales' reduction
    assert [kernel.metadata.shared <= 256 for kernel in compile_only] == [True]


@pytest.mark.parametrize("columns", [14336, 1536])
@pytest.mark.parametrize("group", [128, None], ids=["group-128", "per-token"])
def test_the_silu_mul_quantization_compiles_for_sm90_without_spills(
    compile_only: list, columns: int, group: int | None
) -> None:
    from kvserve.kernels.fp8_quant import launch_quant_kernel

    gate_up = torch.zeros(4, 2 * columns, dtype=torch.bfloat16)
    launch_quant_kernel(gate_up, group, None, pdl=True, gated=True)
    assert stack_bytes(compile_only) == [0] * len(compile_only)


@pytest.mark.parametrize("rows", [1, 16, 33, 64])
@pytest.mark.parametrize("x_is", ["bf16", "e4m3", "gated"])
@pytest.mark.parametrize("scales", ["per-channel", "block-128"])
def test_the_fp8_tensor_core_kernel_compiles_for_sm90_without_spills(
    compile_only: list, rows: int, x_is: str, scales: str
) -> None:
    """Each way x reaches it: bf16 (quantized in the loop, or first past 32 rows), e4m3 with the
    scales the norm wrote, and a SwiGLU's gate/up (the quantization applies the SiLU-mul; on
    this CPU it is the reference; up to 32 rows the SiLU-mul kernel runs first)."""
    from kvserve.kernels.fp8_quant import FP8
    from kvserve.kernels.fp8_skinny_gemm import X_GROUP, fp8_skinny_linear

    n, k = 1024, 4096
    weight = torch.zeros(n, k, dtype=FP8)
    block = (128, 128) if scales == "block-128" else None
    scale = torch.ones(n // 128, k // 128) if block else torch.ones(n)
    x = torch.zeros(rows, 2 * k if x_is == "gated" else k, dtype=torch.bfloat16)
    x_scales = None
    if x_is == "e4m3":
        x, x_scales = x.to(FP8), torch.ones(rows, k // X_GROUP)
    fp8_skinny_linear(x, weight, scale, block=block, pdl=True, gated=x_is == "gated",
                      x_scales=x_scales, out_dtype=torch.bfloat16)  # fmt: skip
    assert stack_bytes(compile_only) == [0] * len(compile_only)


@pytest.mark.parametrize(("rows", "n", "prefetch"), [(64, 4096, 0), (64, 6144, 4), (40, 4096, 8)])
def test_the_chained_fp8_kernel_compiles_for_sm90_with_l2_requests_before_its_wait(
    compile_only: list, rows: int, n: int, prefetch: int
) -> None:
    """The chained loop's own tiling (64 W rows, 8 stages) past 32 rows, with W's first K steps
    asked of L2 (``prefetch_steps``) before the dependent-launch wait, without spills."""
    from kvserve.kernels.fp8_quant import FP8
    from kvserve.kernels.fp8_skinny_gemm import fp8_skinny_config, fp8_skinny_linear

    k = 4096
    cfg = replace(fp8_skinny_config(rows, n, k, chained=True), prefetch_steps=prefetch)
    assert (cfg.block_n, cfg.num_stages) == (64, 8)
    x, x_scales = torch.zeros(rows, k, dtype=FP8), torch.ones(rows, 1)
    fp8_skinny_linear(x, torch.zeros(n, k, dtype=FP8), torch.ones(n), config=cfg, pdl=True,
                      x_scales=x_scales, out_dtype=torch.bfloat16)  # fmt: skip
    assert stack_bytes(compile_only) == [0]
    ptx = compile_only[-1].asm["ptx"]
    assert ("prefetch.global.L2" in ptx) == bool(prefetch)
    assert not prefetch or ptx.rindex("prefetch.global.L2") < ptx.index("griddepcontrol.wait")
