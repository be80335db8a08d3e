"""FP8 weight quantization to each scale layout (online quantization, dummy weights, tests)
and the requantization of per-shard per-tensor scales to one."""

from __future__ import annotations

import torch

from kvserve.kernels.fp8_quant import FP8, FP8_MAX, MIN_SCALE


def quantize_weight(
    w: torch.Tensor, weight: str, block: tuple[int, int] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [N, K]`` float -> (fp8 ``[N, K]``, fp32 scale: ``[1]``, ``[N]`` or
    ``[ceil(N/bn), ceil(K/bk)]``) with ``w ~= q * scale``."""
    w32 = w.float()
    if weight == "tensor":
        scale = (w32.abs().amax() / FP8_MAX).clamp(min=MIN_SCALE).reshape(1)
        return (w32 / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale
    if weight == "channel":
        scale = (w32.abs().amax(dim=1) / FP8_MAX).clamp(min=MIN_SCALE)
        return (w32 / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale
    assert block is not None
    n, k = w32.shape
    bn, bk = block
    rows, cols = -(-n // bn), -(-k // bk)
    padded = torch.zeros(rows * bn, cols * bk, device=w.device)
    padded[:n, :k] = w32
    tiles = padded.view(rows, bn, cols, bk)
    scale = (tiles.abs().amax(dim=(1, 3)) / FP8_MAX).clamp(min=MIN_SCALE)
    q = (tiles / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
    return q.view(rows * bn, cols * bk)[:n, :k].to(FP8).contiguous(), scale


def requantize_to_max(
    w: torch.Tensor, shard_scales: torch.Tensor, offsets: list[int], sizes: list[int]
) -> torch.Tensor:
    """One scale for a merged layer whose shards came with their own per-tensor scales: each
    shard is rescaled to the largest (in place); returns that scale as ``[1]``."""
    top = shard_scales.max()
    for i, (offset, size) in enumerate(zip(offsets, sizes)):
        rows = w[offset : offset + size]
        ratio = shard_scales[i] / top
        rows.copy_((rows.float() * ratio).clamp(-FP8_MAX, FP8_MAX).to(FP8))
    return top.reshape(1).clone()
