"""Fill L2 with a weight ahead of the kernel that reads it.

A decode step at small batch streams each weight from HBM once, in kernels of a few
microseconds whose first and last microsecond move little; between them run the attention
kernels, which read almost nothing. Asking L2 for the next weight while those run moves its
bytes during time HBM would sit idle, and its GEMV then reads L2. Each lane of a program asks
for one ``CHUNK``-byte run: one bulk prefetch (``_triton.prefetch_l2_bulk``) or, with
``LINES``, one ``prefetch.global.L2`` per 128-byte line of it.
"""

from __future__ import annotations

import torch

from kvserve.kernels._triton import jit, prefetch_l2, prefetch_l2_bulk, require_triton, tl

LINE_BYTES = 128
LANES = 32  # one warp a program


@jit
def _l2_prefetch_kernel(ptr, nbytes, CHUNK: tl.constexpr, LINES: tl.constexpr):
    runs = tl.program_id(0).to(tl.int64) * 32 + tl.arange(0, 32)
    start = runs * CHUNK
    size = tl.minimum(nbytes - start, CHUNK) // 16 * 16
    if LINES:
        for line in tl.static_range(0, CHUNK, 128):
            prefetch_l2(ptr + start + line, line < size)
    else:
        prefetch_l2_bulk(ptr + start, size)


def l2_prefetch(
    tensor: torch.Tensor, nbytes: int | None = None, chunk: int = 16384, lines: bool = False
) -> None:
    """Ask L2 for the first ``nbytes`` (all when None) of ``tensor``'s storage."""
    require_triton()
    assert tensor.is_contiguous(), "a contiguous tensor's storage"
    data = tensor.reshape(-1).view(torch.uint8)
    total = max(0, data.numel() if nbytes is None else min(nbytes, data.numel()))
    grid = max(1, -(-total // (chunk * LANES)))
    _l2_prefetch_kernel[(grid,)](data, total, CHUNK=chunk, LINES=lines, num_warps=1)
