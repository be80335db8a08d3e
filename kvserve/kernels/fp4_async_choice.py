"""When kvserve takes the asynchronous-MMA FP4 GEMM (``fp4_async_gemm.py``) and how it launches
it: its settings, the steps and weights it takes, and its split of K."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from kvserve.config import env_switch
from kvserve.kernels.fp4_async_decode import CODE_UNIT_LOG2, HAS_GLUON, STEP_K
from kvserve.kernels.fp4_reference import MXFP4_GROUP, group_size_of
from kvserve.kernels.fp4_tile import MAX_BLOCK_M, block_m_for, code_words

ASYNC_ENV = "KVSERVE_FP4_ASYNC"
BITS_ENV = "KVSERVE_FP4_ASYNC_BITS"
TWO_PROGRAMS_ENV = "KVSERVE_FP4_ASYNC_TWO_PROGRAMS"
# Rows of x the default hands this kernel (with ``KVSERVE_FP4_ASYNC=1``): past the 16 rows where
# the Triton kernel's mma.sync (W as B) is its best case, up to one 128-row x tile.
ASYNC_MIN_ROWS, ASYNC_MAX_ROWS = 17, MAX_BLOCK_M
# The largest MXFP4 scale exponent the kernel takes (``CODE_UNIT_LOG2``)
MAX_E8M0 = 254 - CODE_UNIT_LOG2
_MIN_STEPS_PER_SPLIT = 4
# A thread's registers for two 8-warp programs an SM (2 x 256 x 128 = the SM's 64K): ptxas fits
# the K loop of x tiles up to 64 rows in them without spills (190 uncapped: one program an SM,
# two warps a scheduler, the step latency-bound; s74 Nsight Compute); 128-row tiles would spill
TWO_PROGRAMS_REGISTERS = 128


def two_programs_fit(rows: int) -> bool:
    """Whether an x of ``rows`` rows takes a tile that fits ``TWO_PROGRAMS_REGISTERS``."""
    return block_m_for(rows) <= MAX_BLOCK_M // 2


@dataclass(frozen=True)
class AsyncGemmConfig:
    split_k: int = 1
    num_warps: int = 8  # 16 rows of W a warp: the W tile is 16 * num_warps rows
    stages: int = 4  # ring slots: copies run stages - 2 steps ahead
    bits: bool = False  # the bit-placing W decode
    max_registers: int | None = None  # TWO_PROGRAMS_REGISTERS: two programs an SM


@functools.cache
def async_bits_enabled() -> bool:
    """``KVSERVE_FP4_ASYNC_BITS``: 1 decodes W by placing its codes' bits into bf16
    (``_FP4_WORD_TO_BF16_BITS``); 0 (the default) by the e4m3 trick."""
    return env_switch(BITS_ENV, default=False)


@functools.cache
def async_two_programs_enabled() -> bool:
    """``KVSERVE_FP4_ASYNC_TWO_PROGRAMS``: 1 caps a thread at ``TWO_PROGRAMS_REGISTERS`` for x
    tiles up to 64 rows, so two programs share an SM; 0 (the default) leaves ptxas uncapped."""
    return env_switch(TWO_PROGRAMS_ENV, default=False)


@functools.cache
def async_gemm_enabled() -> bool:
    """``KVSERVE_FP4_ASYNC``: 1 runs FP4 steps of 17-128 rows on this kernel (Hopper, bf16
    activations); 0 (the default) on the Triton kernel (``fp4_gemm.py``)."""
    return env_switch(ASYNC_ENV, default=False)


@functools.cache
def _on_hopper(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9


def async_gemm_takes(x: torch.Tensor, rows: int) -> bool:
    """Whether this kernel takes a step of a weight that ``weight_fits``: a Hopper GPU with
    Gluon, bf16 x of ``rows`` rows in the kernel's range."""
    return (
        HAS_GLUON
        and ASYNC_MIN_ROWS <= rows <= ASYNC_MAX_ROWS
        and x.dtype == torch.bfloat16
        and _on_hopper(x.device)
    )


def weight_fits(packed: torch.Tensor, block_scale: torch.Tensor) -> bool:
    """An FP4 weight this kernel can take: K a multiple of 128, its rows word-aligned, and its
    block scales in range (NVFP4's always, MXFP4's up to 2**9). A host sync: call once per
    weight, at load."""
    k = packed.shape[-1] * 2
    if k % STEP_K or code_words(packed).dtype != torch.int32:
        return False
    if group_size_of(block_scale) != MXFP4_GROUP:
        return True
    return block_scale.numel() == 0 or int(block_scale.max()) <= MAX_E8M0


def async_config(
    m: int, n: int, k: int, *, num_sms: int = 132, bits: bool = False, two_programs: bool = False
) -> AsyncGemmConfig:
    """One program an SM (the kernel's registers allow no more), or two with ``two_programs``
    and x tiles up to 64 rows: K split until the programs fill 70% of those places, each split
    keeping four or more K steps (the loop's unrolled iteration). The best splits at one program
    an SM on an H100 (s74, 32 and 64 rows of Llama-3-8B): qkv's 48 tiles 2 (96 programs; 4 was
    20% slower), o's and down's 32 tiles 4, gate_up's 224 tiles 1."""
    two = two_programs and two_programs_fit(m)
    tiles = -(-m // block_m_for(m)) * -(-n // (16 * AsyncGemmConfig.num_warps))
    steps = k // STEP_K
    split = 1
    places = num_sms * (2 if two else 1)
    while tiles * split < 0.7 * places and steps // (2 * split) >= _MIN_STEPS_PER_SPLIT:
        split *= 2
    return AsyncGemmConfig(
        split_k=split, bits=bits, max_registers=TWO_PROGRAMS_REGISTERS if two else None
    )
