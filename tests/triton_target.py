"""Compiling Triton kernels for the H200 on a machine without a GPU: Triton compiles for sm_90
anywhere; only its driver, which supplies a launch's device, stream and target, stands in."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


class _HopperTarget:
    """Triton's driver as far as a launch with ``warmup`` asks it: device, stream, target."""

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self):  # noqa: ANN201 - triton's GPUTarget
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)


@pytest.fixture
def hopper_driver(tmp_path, monkeypatch) -> Iterator[None]:  # noqa: ANN001
    """The stand-in driver, and Triton caches of the test's own: an empty disk cache, and no
    kvserve kernel compiled in memory (before or after). The kernels' hashes are settled first,
    in the order the engine and compile ahead's workers settle them (``settle_kernel_hashes``):
    a kernel compiled here before its helpers were hashed would keep a name of its own for the
    rest of the session, and a later test's workers would fill the disk cache under another."""
    from triton.runtime.driver import driver

    from kvserve.kernels.kernel_hashes import kvserve_kernels, settle_kernel_hashes

    settle_kernel_hashes()

    def forget_compiled() -> None:
        for kernel in kvserve_kernels():
            kernel.device_caches.clear()

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    previous = driver._active  # None on a machine without a GPU: reset_active would fail
    driver.set_active(_HopperTarget())
    forget_compiled()
    try:
        yield
    finally:
        forget_compiled()
        driver.set_active(previous)


def compile_rms_norm(hidden: int, residual: bool) -> None:
    """The RMSNorm kernel as ``rmsnorm._launch`` compiles it, without a launch."""
    from kvserve.kernels.rmsnorm import _rms_norm_kernel

    x = torch.zeros(4, hidden, dtype=torch.bfloat16)
    w = torch.ones(hidden, dtype=torch.bfloat16)
    _rms_norm_kernel.warmup(
        x, x, w, x, hidden, 1e-6, hidden, hidden, hidden, HAS_RESIDUAL=residual,
        BLOCK=hidden, USE_PDL=True, num_warps=1, grid=(4,),
    )  # fmt: skip


@pytest.fixture
def compile_only(hopper_driver, monkeypatch) -> Iterator[list]:  # noqa: ANN001
    """Every Triton launch while the test runs compiles its kernel for sm_90 and launches
    nothing: a kvserve wrapper that calls its kernel directly can be handed CPU tensors. Yields
    the list the compiled kernels are appended to, launch by launch."""
    from triton.runtime.jit import JITFunction

    compiled: list = []
    run = JITFunction.run

    def compile_instead(self, *args, grid, warmup, **kwargs):  # noqa: ANN001, ANN202
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append(kernel)
        return kernel

    monkeypatch.setattr(JITFunction, "run", compile_instead)
    yield compiled


def stack_bytes(compiled: list) -> list[int]:
    """Bytes of local memory a thread of each kernel ``compile_only`` built (0: no spills)."""
    from benchmarks.kernel_spills import resource_usage

    assert compiled, "no kernel was built"
    assert all(kernel.asm["cubin"][:4] == b"\x7fELF" for kernel in compiled)
    return [resource_usage(kernel.asm["cubin"])["STACK"] for kernel in compiled]
