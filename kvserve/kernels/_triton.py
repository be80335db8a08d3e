"""Triton when installed, else stand-ins, so kernel modules import on CPU-only machines.

Kernels decorated with ``jit`` are plain (never called) functions without Triton; the launchers
call ``require_triton()`` first. Annotations like ``tl.constexpr`` stay strings under
``from __future__ import annotations``, which Triton reads as written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # CPU-only install: the torch references still work
    triton = None
    tl = None
    HAS_TRITON = False


def jit(fn: Callable[..., Any]) -> Any:
    return triton.jit(fn) if HAS_TRITON else fn


def require_triton() -> None:
    if not HAS_TRITON:
        raise RuntimeError("this kernel needs Triton (a CUDA machine); use the torch reference")


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())
