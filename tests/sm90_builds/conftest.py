"""Kernels built for the H200 (sm_90) by Triton's compiler and ptxas on a machine without a
GPU (``compile_only``): the interpreter runs a kernel's Python, so only this catches what the
GPU's compiler refuses (inline PTX above all), or a kernel that spills its registers to local
memory, before device time is spent on it."""

from __future__ import annotations

from triton_target import compile_only, hopper_driver  # noqa: F401 - fixtures
