"""Weights asked of L2 while a decode step's attention runs.

At a small batch and a short context the decode attention kernels (rotary and KV store, the
splits, their merge) are a chain of latency-bound launches: about 8 us a layer on the H200 in
which DRAM moves a few MB of keys and values and otherwise idles, and then the o projection's
GEMV reads its weight. Here the split kernel's programs that have no keys to read (the splits
past a short sequence's end, which exit at once) ask L2 for the weights the layer reads next
(``prefetch.global.L2``, one request a 128-byte line), up to a budget: the o projection's,
then the dense MLP's gate/up. A long context leaves no split idle, so nothing is asked where
the attention itself needs DRAM.

The budget is ``KVSERVE_DECODE_L2_WARM_MB`` (0, the default, asks for nothing). Earlier tries
that asked L2 ahead from the GEMV itself (s44, s68 in ``benchmarks/results/INDEX.md``) were
slower: there the requests shared DRAM with the GEMV before, which streams at full rate.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kvserve.config import env_switch
from kvserve.errors import ConfigError
from kvserve.kernels._triton import constexpr, jit, prefetch_l2, tl

WARM_ENV = "KVSERVE_DECODE_L2_WARM_MB"
ROUTER_WARM_ENV = "KVSERVE_ROUTER_L2_WARM"
MAX_WARM_MB = 64  # the H200's L2 is 50 MB: more can only evict what was asked first
LINE_BYTES = constexpr(128)
LINES_A_PASS = constexpr(512)  # requests a program issues at once: 4 a thread at 4 warps


@functools.cache
def warm_budget_mb() -> int:
    """``KVSERVE_DECODE_L2_WARM_MB``: MB of the next weights a decode step's idle attention
    programs ask L2 for (0 to 64; 0 asks for nothing)."""
    value = os.environ.get(WARM_ENV, "0")
    if not value.isdigit() or int(value) > MAX_WARM_MB:
        raise ConfigError(f"{WARM_ENV}={value!r}: expected whole MB, 0 to {MAX_WARM_MB}")
    return int(value)


@dataclass(frozen=True)
class L2Warm:
    """Up to two byte runs to ask L2 for, in order: ``first[:first_bytes]`` then
    ``second[:second_bytes]`` (flat uint8 views of weights)."""

    first: torch.Tensor
    first_bytes: int
    second: torch.Tensor
    second_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.first_bytes + self.second_bytes


def weight_bytes(module: torch.nn.Module) -> torch.Tensor | None:
    """The largest tensor a layer holds (its weight, in whatever format the quant method keeps
    it: FP8, packed FP4 codes, bf16), as flat bytes; None if it has none or it is not
    contiguous."""
    tensors = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
    if not tensors:
        return None
    largest = max(tensors, key=lambda t: t.numel() * t.element_size())
    if not largest.is_contiguous() or largest.numel() == 0:
        return None
    return largest.detach().reshape(-1).view(torch.uint8)


def l2_warm_of(weights: list[torch.Tensor], budget_bytes: int) -> L2Warm | None:
    """The first ``budget_bytes`` of ``weights`` (flat bytes, at most two, read in that order
    after the attention); None when there is nothing to ask for."""
    runs = [w for w in weights[:2] if w.numel() > 0]
    if budget_bytes <= 0 or not runs:
        return None
    first_bytes = min(runs[0].numel(), budget_bytes)
    second = runs[1] if len(runs) > 1 else runs[0]
    second_bytes = min(second.numel(), budget_bytes - first_bytes) if len(runs) > 1 else 0
    return L2Warm(runs[0], first_bytes, second, second_bytes)


def warm_kernel_args(warm: L2Warm | None, stand_in: torch.Tensor) -> dict[str, Any]:
    """The split kernel's warm arguments; ``stand_in`` fills the pointers when there is no
    warm (``WARM`` off: never read)."""
    if warm is None:
        return {"warm0_ptr": stand_in, "warm0_bytes": 0, "warm1_ptr": stand_in,
                "warm1_bytes": 0, "WARM": False}  # fmt: skip
    return {"warm0_ptr": warm.first, "warm0_bytes": warm.first_bytes, "warm1_ptr": warm.second,
            "warm1_bytes": warm.second_bytes, "WARM": True}  # fmt: skip


@jit
def warm_l2_share(warm0_ptr, warm0_bytes, warm1_ptr, warm1_bytes, share, shares):
    """Ask L2 for share ``share`` of ``shares`` equal runs of whole lines over the first run of
    bytes, then the second. Fire and forget: no register waits on a request."""
    lines0 = tl.cdiv(warm0_bytes, LINE_BYTES)
    total = lines0 + tl.cdiv(warm1_bytes, LINE_BYTES)
    per = tl.cdiv(total, shares)
    first = share * per
    last = tl.minimum(first + per, total)
    for l0 in range(first, last, LINES_A_PASS):
        line = l0 + tl.arange(0, LINES_A_PASS)
        live = line < last
        in_first = line < lines0
        prefetch_l2(warm0_ptr + line.to(tl.int64) * LINE_BYTES, live & in_first)
        later = (line - lines0).to(tl.int64) * LINE_BYTES
        prefetch_l2(warm1_ptr + later, live & (line >= lines0))


class LazyWarm:
    """An L2 warm made by ``make`` at its first use, the first decode step: after loading, when
    the weights are where they stay. The warm's views hold the tensors they were made from."""

    def __init__(self, make: Callable[[], L2Warm | None]) -> None:
        self._make = make
        self._warm: L2Warm | None = None
        self._made = False

    def get(self) -> L2Warm | None:
        if not self._made:
            self._warm, self._made = self._make(), True
        return self._warm


def next_weights_warm(layers: list[torch.nn.Module]) -> L2Warm | None:
    """The first ``KVSERVE_DECODE_L2_WARM_MB`` of the weights of ``layers`` (those a decoder
    layer reads after its attention, in order: its o projection, then a dense MLP's gate/up);
    None off the GPU or without a budget."""
    budget = warm_budget_mb() << 20
    weights = [w for w in map(weight_bytes, layers) if w is not None and w.is_cuda]
    return l2_warm_of(weights, budget) if budget else None


@functools.cache
def router_warm_enabled() -> bool:
    """``KVSERVE_ROUTER_L2_WARM``: 1 has a decode step's fused norm + router kernel ask L2 for
    a stacked shared expert's gate/up rows, which the experts' GEMV reads next whatever the
    routing (0, the default: nothing asked)."""
    return env_switch(ROUTER_WARM_ENV, default=False)


def shared_expert_warm(moe: torch.nn.Module) -> L2Warm | None:
    """The shared expert's gate/up rows of a mixture-of-experts layer that stacks it last
    (``w13`` [E + 1, 2I, ...]), as an L2 warm; None off the GPU, without such a stack, or
    switched off."""
    stack = getattr(moe, "w13", None) if getattr(moe, "shared_expert", False) else None
    if stack is None or not stack.is_cuda or not router_warm_enabled():
        return None
    last = stack[-1]
    if not last.is_contiguous():
        return None
    return l2_warm_of(
        [last.detach().reshape(-1).view(torch.uint8)], last.numel() * last.element_size()
    )
