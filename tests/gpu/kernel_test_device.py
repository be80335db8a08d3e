"""Where the kernel tests run: ``KVSERVE_TEST_DEVICE`` (cuda by default; cpu under Triton's
interpreter, ``TRITON_INTERPRET=1``), and the bf16 parameter that the interpreter skips."""

from __future__ import annotations

import os

import pytest
import torch

DEVICE = torch.device(os.environ.get("KVSERVE_TEST_DEVICE", "cuda"))
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
BF16_UNLESS_INTERPRETED = pytest.param(
    torch.bfloat16,
    marks=pytest.mark.skipif(INTERPRETED, reason="bf16 is broken in Triton's interpreter"),
)
