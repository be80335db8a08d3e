"""Where the kernel tests run: ``KVSERVE_TEST_DEVICE`` (cuda by default; cpu under Triton's
interpreter, ``TRITON_INTERPRET=1``), the bf16 parameter that the interpreter skips, and the
marks for cases only a GPU runs."""

from __future__ import annotations

import os

import pytest
import torch

DEVICE = torch.device(os.environ.get("KVSERVE_TEST_DEVICE", "cuda"))
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def _scalar_index_under_numpy2() -> None:
    """Triton 3.6's interpreter holds scalars as 1-element arrays and indexes with ``int()`` of
    them, which numpy >= 2.4 refuses: ``range(start, end)`` over runtime values then fails."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor

    def patch(tensor, scope):  # noqa: ANN001, ANN202
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    interpreter._patch_lang_tensor = patch


if INTERPRETED:
    _scalar_index_under_numpy2()

BF16_UNLESS_INTERPRETED = pytest.param(
    torch.bfloat16,
    marks=pytest.mark.skipif(INTERPRETED, reason="bf16 is broken in Triton's interpreter"),
)

# Llama-sized shapes: minutes each in the interpreter, seconds on a GPU
ON_GPU_ONLY = pytest.mark.skipif(INTERPRETED, reason="too slow in Triton's interpreter")
NEEDS_CUDA_GRAPHS = pytest.mark.skipif(DEVICE.type != "cuda", reason="CUDA graphs need a GPU")
# Paths whose decoding is inline PTX: the interpreter runs a plain-Triton fallback instead
NEEDS_PTX = pytest.mark.skipif(INTERPRETED, reason="inline PTX does not run in the interpreter")
