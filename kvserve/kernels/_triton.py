"""Triton when installed, else stand-ins, so kernel modules import on CPU-only machines.

Kernels decorated with ``jit`` are plain (never called) functions without Triton; the launchers
call ``require_triton()`` first. Annotations like ``tl.constexpr`` stay strings under
``from __future__ import annotations``, which Triton reads as written.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch

from kvserve.config import env_switch

try:
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    HAS_TRITON = True
except ImportError:  # CPU-only install: the torch references still work
    triton = None
    tl = None
    HAS_TRITON = False


def jit(
    fn: Callable[..., Any] | None = None,
    *,
    do_not_specialize: tuple[str, ...] = (),
    do_not_specialize_on_alignment: tuple[str, ...] = (),
) -> Any:
    """``triton.jit``; ``@jit(do_not_specialize=(...))`` names int arguments that vary from call
    to call and only bound loops or masks, so that a value of 1 or a multiple of 16 does not
    compile another kernel (one more compile a request could pay for after warm-up);
    ``do_not_specialize_on_alignment`` names pointers that may or may not be 16-byte aligned
    from call to call (views of a step's tensors from row ``i``), for the same reason."""
    if fn is None:
        return lambda f: jit(
            f,
            do_not_specialize=do_not_specialize,
            do_not_specialize_on_alignment=do_not_specialize_on_alignment,
        )
    if not HAS_TRITON:
        return fn
    return triton.jit(
        fn,
        do_not_specialize=list(do_not_specialize) or None,
        do_not_specialize_on_alignment=list(do_not_specialize_on_alignment) or None,
    )


def require_triton() -> None:
    if not HAS_TRITON:
        raise RuntimeError("this kernel needs Triton (a CUDA machine); use the torch reference")


def constexpr(value: int) -> Any:  # noqa: ANN401 - tl.constexpr, or the plain value
    """A module-level constant that kernels may read (Triton refuses other globals)."""
    return tl.constexpr(value) if HAS_TRITON else value


def interpreting() -> bool:
    """Running under Triton's interpreter (``TRITON_INTERPRET=1``: CPU tensors, no PTX)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 132  # TRITON_INTERPRET runs on CPU tensors; any fixed number will do
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.cache
def hopper_or_newer(device: torch.device) -> bool:
    """A CUDA device of compute capability 9.0 or above (wgmma, programmatic dependent launch)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


# Programmatic dependent launch (sm_90+). A kernel launched with it may be scheduled while the
# kernel before it in the stream drains, instead of after; it waits (``pdl_wait``) before it
# touches memory that the kernels of this step write, so only the launch latency overlaps and,
# where a kernel loads before its wait what no kernel of the step writes (the word GEMV's and
# the router's weights; ``early_loads_enabled``), those reads. Once past the wait a kernel lets
# the next one launch (``pdl_release``). The wrappers take ``pdl=``; the kernels see it as the
# constexpr ``USE_PDL``.
EARLY_LOADS_ENV = "KVSERVE_PDL_EARLY_LOADS"


@functools.cache
def early_loads_enabled() -> bool:
    """``KVSERVE_PDL_EARLY_LOADS``: 1 (the default) has the decode attention kernels and the
    rotary kernel read before their dependent-launch wait what was written before the step
    (sequence lengths, page tables, positions, the rotary table, slots, and the keys and values
    of past tokens: the host, earlier steps and launches without PDL wrote them, and every
    kernel of a step starts after the step's first one, which starts after all of those), so
    those reads overlap the kernel before; 0 reads them after the wait."""
    return env_switch(EARLY_LOADS_ENV, default=True)


def early_loads(pdl: bool) -> bool:
    """A launch's ``EARLY_LOADS``: reads ahead of the wait only where a wait overlaps the kernel
    before (``pdl``) and ``early_loads_enabled``."""
    return pdl and early_loads_enabled()


def launch_options(pdl: bool) -> dict[str, bool]:
    """Keyword arguments for a launch of a kernel that calls ``pdl_wait``."""
    return {"USE_PDL": True, "launch_pdl": True} if pdl else {"USE_PDL": False}


@jit
def pdl_wait(USE_PDL: tl.constexpr):
    if USE_PDL:
        gdc_wait()


@jit
def pdl_release(USE_PDL: tl.constexpr):
    if USE_PDL:
        gdc_launch_dependents()


@jit
def prefetch_l2(ptrs, mask):
    """Ask L2 for the 128-byte lines at ``ptrs`` where ``mask`` holds (``prefetch.global.L2``:
    no registers, and L2 stays coherent with other SMs' stores, unlike L1). GPU only."""
    tl.inline_asm_elementwise(
        asm="{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
        constraints="=r,l,r",
        args=[ptrs, mask.to(tl.int32)],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )
