"""A stacked shared expert's weights asked of L2 while a MoE decode step routes.

At a small batch, once the attention's o projection is done, a MoE layer's fused norm + router
kernel (``normed_router``) runs a few microseconds of latency-bound work in which DRAM idles;
then the experts' gate/up GEMV reads the routed experts' rows and, where the layer stacks its
shared expert as the last expert (``kvserve.layers.moe``), that expert's rows too, whatever the
routing. With ``KVSERVE_ROUTER_L2_WARM=1`` the router kernel's programs ask L2 for those rows
(``prefetch.global.L2``, one request a 128-byte line) right after their dependent-launch wait,
so the GEMV finds them there. Off by default until an H200 measures it on GLM-4.5-Air.

Tried and dropped (s81, ``benchmarks/results/INDEX.md``): the decode attention's idle split
programs asking L2 for the o projection and a dense MLP's gate/up while the attention runs;
flat while it asked for o alone, slower past it.
"""

from __future__ import annotations

import functools

import torch

from kvserve.config import env_switch
from kvserve.kernels._triton import constexpr, jit, prefetch_l2, tl

ROUTER_WARM_ENV = "KVSERVE_ROUTER_L2_WARM"
LINE_BYTES = constexpr(128)
LINES_A_PASS = constexpr(512)  # requests a program issues at once: 4 a thread at 4 warps


@jit
def warm_l2_share(warm_ptr, warm_bytes, share, shares):
    """Ask L2 for share ``share`` of ``shares`` equal runs of whole lines of the bytes. Fire
    and forget: no register waits on a request."""
    total = tl.cdiv(warm_bytes, LINE_BYTES)
    per = tl.cdiv(total, shares)
    first = share * per
    last = tl.minimum(first + per, total)
    for l0 in range(first, last, LINES_A_PASS):
        line = l0 + tl.arange(0, LINES_A_PASS)
        prefetch_l2(warm_ptr + line.to(tl.int64) * LINE_BYTES, line < last)


@functools.cache
def router_warm_enabled() -> bool:
    """``KVSERVE_ROUTER_L2_WARM``: 1 has a decode step's fused norm + router kernel ask L2 for
    a stacked shared expert's gate/up rows, which the experts' GEMV reads next whatever the
    routing (0, the default: nothing asked)."""
    return env_switch(ROUTER_WARM_ENV, default=False)


def shared_expert_warm(moe: torch.nn.Module) -> torch.Tensor | None:
    """The shared expert's gate/up rows of a mixture-of-experts layer that stacks it last
    (``w13`` [E + 1, 2I, ...]), as flat bytes to ask L2 for (a view: it holds the stack); None
    off the GPU, without such a stack, or switched off."""
    stack = getattr(moe, "w13", None) if getattr(moe, "shared_expert", False) else None
    if stack is None or not stack.is_cuda or not router_warm_enabled():
        return None
    last = stack[-1]
    if not last.is_contiguous():
        return None
    return last.detach().reshape(-1).view(torch.uint8)
