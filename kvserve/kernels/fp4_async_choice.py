"""When kvserve takes the asynchronous-MMA FP4 GEMM (``fp4_async_gemm.py``) and how it launches
it: its settings, the steps and weights it takes, and its split of K."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

from kvserve.config import env_switch
from kvserve.errors import ConfigError
from kvserve.kernels.fp4_async_decode import HAS_GLUON, STEP_K, W_ROWS_A_WARP, max_e8m0
from kvserve.kernels.fp4_reference import MXFP4_GROUP, NVFP4_GROUP, group_size_of
from kvserve.kernels.fp4_tile import MAX_BLOCK_M, block_m_for, code_words

ASYNC_ENV = "KVSERVE_FP4_ASYNC"
BITS_ENV = "KVSERVE_FP4_ASYNC_BITS"
PERMUTE_IN_PRODUCER_ENV = "KVSERVE_FP4_PERMUTE_IN_PRODUCER"
# none; where it measured faster (``mode_takes_shape``); every step in the row range
ASYNC_MODES = ("0", "auto", "1")
# Rows of x the default hands this kernel (with ``KVSERVE_FP4_ASYNC=1``): past the 16 rows where
# the Triton kernel's mma.sync (W as B) is its best case, up to one 128-row x tile.
ASYNC_MIN_ROWS, ASYNC_MAX_ROWS = 17, MAX_BLOCK_M
# Programs that fill this share of the places on the SMs need no split of K
_FILLED_SHARE = 0.7
_MIN_STEPS_PER_SPLIT = 4
# K steps a split that carry a program's fixed costs (the pipeline's fill, the split's sum),
# by x tile: at 64 rows the Triton kernel's step is cheaper, so it takes a longer split to pay
_LONG_SPLIT_STEPS = {MAX_BLOCK_M: 16, MAX_BLOCK_M // 2: 24}
# The same where x's producer writes it in the K-step order (``KVSERVE_FP4_PERMUTE_IN_PRODUCER``),
# so no permutation kernel runs, by block-scale group: 32-row tiles pay from 16 K steps (s77
# H100, qkv and down at 32 rows: 5-24% less time than the Triton kernel); 64-row tiles from 16
# in MXFP4 (qkv 17.9 against 20.0 us), where NVFP4's qkv still takes 3% more (19.3 against 18.7)
_LONG_SPLIT_STEPS_FROM_PRODUCER = {
    NVFP4_GROUP: _LONG_SPLIT_STEPS | {MAX_BLOCK_M // 4: 16},
    MXFP4_GROUP: _LONG_SPLIT_STEPS | {MAX_BLOCK_M // 2: 16, MAX_BLOCK_M // 4: 16},
}
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
    num_warps: int = 8  # the W tile is W_ROWS_A_WARP * num_warps rows
    stages: int = 4  # ring slots: copies run stages - 2 steps ahead
    bits: bool = True  # the bit-placing W decode
    max_registers: int | None = None  # TWO_PROGRAMS_REGISTERS: two programs an SM


@functools.cache
def async_bits_enabled() -> bool:
    """``KVSERVE_FP4_ASYNC_BITS``: 1 (the default) decodes W by placing its codes' bits into
    bf16 (``_FP4_WORD_TO_BF16_BITS``; faster in every shape of s75's H100 sweep); 0 by the
    e4m3 trick."""
    return env_switch(BITS_ENV, default=True)


@functools.cache
def permute_in_producer() -> bool:
    """``KVSERVE_FP4_PERMUTE_IN_PRODUCER``: 1 has x's producer (the RMSNorm before q/k/v or
    gate/up, the SiLU-mul before down) write x in this kernel's K-step order, so the GEMM runs
    no permutation kernel of its own (the default: +1.5-1.9% at batch 64-128 on an H100, s77);
    0 keeps that kernel."""
    return env_switch(PERMUTE_IN_PRODUCER_ENV, default=True)


@functools.cache
def async_gemm_mode() -> str:
    """``KVSERVE_FP4_ASYNC``: which FP4 steps of 17-128 rows (Hopper, bf16 activations) run on
    this kernel instead of the Triton one (``fp4_gemm.py``): ``0`` none; ``auto`` (the
    default) those where it measured faster (``mode_takes_shape``); ``1`` all of them."""
    value = os.environ.get(ASYNC_ENV, "auto")
    if value not in ASYNC_MODES:
        raise ConfigError(f"{ASYNC_ENV}={value!r}: expected one of {', '.join(ASYNC_MODES)}")
    return value


def async_gemm_enabled(device: torch.device) -> bool:
    """Whether this kernel may take any step on ``device``: Gluon, a Hopper GPU and
    ``KVSERVE_FP4_ASYNC`` not 0 (weights are checked for it at load only then)."""
    return _runs_on(device) and async_gemm_mode() != "0"


@functools.cache
def _runs_on(device: torch.device) -> bool:
    """Gluon and a Hopper GPU."""
    return HAS_GLUON and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9


def async_gemm_takes(x: torch.Tensor, rows: int) -> bool:
    """Whether this kernel takes a step of a weight that ``weight_fits``: a Hopper GPU with
    Gluon, bf16 x of ``rows`` rows in the kernel's range."""
    return (
        ASYNC_MIN_ROWS <= rows <= ASYNC_MAX_ROWS
        and x.dtype == torch.bfloat16
        and _runs_on(x.device)
    )


def weight_fits(packed: torch.Tensor, block_scale: torch.Tensor, bits: bool) -> bool:
    """An FP4 weight this kernel can take with the ``bits`` decode or not: K a multiple of 128,
    its rows word-aligned, and its block scales in range (NVFP4's always, MXFP4's up to 2**9,
    2**1 with ``bits``: ``max_e8m0``). A host sync: call once per weight, at load."""
    k = packed.shape[-1] * 2
    if k % STEP_K or code_words(packed).dtype != torch.int32:
        return False
    if group_size_of(block_scale) != MXFP4_GROUP:
        return True
    return block_scale.numel() == 0 or int(block_scale.max()) <= max_e8m0(bits)


def _tiles(m: int, n: int, num_warps: int) -> int:
    return -(-m // block_m_for(m)) * -(-n // (W_ROWS_A_WARP * num_warps))


def async_config(
    m: int, n: int, k: int, *, num_sms: int = 132, bits: bool = True
) -> AsyncGemmConfig:
    """K split until the programs, one an SM, fill 70% of the SMs, each split keeping four or
    more K steps (the loop's unrolled iteration); tiles that fill 70% of twice the SMs unsplit
    run two programs an SM (``TWO_PROGRAMS_REGISTERS``) when the x tile fits the cap. On an
    H100 (s74-s75, 32 and 64 rows of Llama-3-8B): qkv's 48 tiles best split 2 (4 was 20%
    slower), o's and down's 32 tiles 4, each slower at two programs; gate_up's 224 tiles
    unsplit, 7-9% faster at two programs."""
    tiles = _tiles(m, n, AsyncGemmConfig.num_warps)
    steps = k // STEP_K
    split = 1
    while tiles * split < _FILLED_SHARE * num_sms and steps // (2 * split) >= _MIN_STEPS_PER_SPLIT:
        split *= 2
    two = split == 1 and two_programs_fit(m) and tiles >= _FILLED_SHARE * 2 * num_sms
    return AsyncGemmConfig(
        split_k=split, bits=bits, max_registers=TWO_PROGRAMS_REGISTERS if two else None
    )


def mode_takes_shape(
    mode: str, m: int, n: int, k: int, num_sms: int, from_producer_group: int | None = None
) -> bool:
    """Whether ``KVSERVE_FP4_ASYNC``'s ``mode`` hands this kernel an [m, k] x [k, n] GEMM of a
    weight it takes. ``auto``: where it beat the Triton kernel in s76's H100 sweep (Llama-3-8B,
    32-128 rows, x permuted by its Triton kernel): W tiles that fill the SMs with K unsplit
    (gate_up: 19-31% less time); at 128-row x tiles (the Triton kernel's cost grows with rows,
    this one's hardly) a split of 16 K steps or more (down's 28: 25-26% less; qkv's 16: 7-9%);
    at 64-row tiles one of 24 or more (down: 4-11%; qkv 14% more in NVFP4); not o's 8 (12-13%
    more at 128 rows), nor splits at 32-row tiles (down: NVFP4 3% more, MXFP4 17% less).
    ``from_producer_group`` (x written in the step order, no permutation kernel; the weight's
    block-scale group): also 32-row tiles whose split keeps 16 K steps (qkv and down; in the
    engine at batch 32, s77 H100: NVFP4 x1.010, MXFP4 x1.066), and in MXFP4 64-row tiles so
    (qkv; x1.015 at batch 64)."""
    if mode != "auto":
        return mode == "1"
    if _tiles(m, n, AsyncGemmConfig.num_warps) >= _FILLED_SHARE * num_sms:
        return True
    table = _LONG_SPLIT_STEPS_FROM_PRODUCER.get(from_producer_group, _LONG_SPLIT_STEPS)
    long_split = table.get(block_m_for(m))
    split = async_config(m, n, k, num_sms=num_sms).split_k
    return long_split is not None and k // STEP_K // split >= long_split


def async_choice(
    x: torch.Tensor, n: int, k: int, num_sms: int, from_producer_group: int | None = None
) -> AsyncGemmConfig | None:
    """This kernel's launch for x [m, k] times an [n, k] weight that ``weight_fits``, by the
    settings; None when the Triton kernel takes it. ``from_producer_group``: x's producer is to
    write it in the K-step order, so no permutation kernel runs before this one; the weight's
    block-scale group (16 or 32 values)."""
    m = x.shape[0]
    if not async_gemm_takes(x, m):
        return None
    mode = async_gemm_mode()
    return _shape_choice(mode, m, n, k, num_sms, async_bits_enabled(), from_producer_group)


@functools.cache
def _shape_choice(
    mode: str, m: int, n: int, k: int, num_sms: int, bits: bool, from_producer_group: int | None
) -> AsyncGemmConfig | None:
    """``async_choice`` of one shape and settings, worked out once (it runs each call)."""
    if not mode_takes_shape(mode, m, n, k, num_sms, from_producer_group):
        return None
    return async_config(m, n, k, num_sms=num_sms, bits=bits)
