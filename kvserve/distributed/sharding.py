"""How a checkpoint tensor of a linear layer splits across tensor-parallel ranks.

One rule covers every format, read off the tensor's shape against the layer's full size: a
tensor whose dimension holds one entry per ``g`` rows (columns) of the weight -- the weight
itself (g = 1), packed FP4 bytes (2 values a byte), per-channel scales, NVFP4 group-16 and
MXFP4 group-32 scales, FP8 128x128 block scales -- is cut at the rank's rows (columns) divided
by ``g``; a cut that would split a block or group is refused. Per-tensor scalars (scales,
global scales, input scales) are replicated."""

from __future__ import annotations

import torch

from kvserve.errors import ConfigError


def _cut(
    tensor: torch.Tensor, dim: int, full: int, start: int, size: int, what: str
) -> torch.Tensor:
    entries = tensor.shape[dim]
    if full % entries:
        raise ConfigError(
            f"tensor parallelism: {what} has {entries} entries along dim {dim} for {full} "
            "weight rows/columns; kvserve cannot tell how it splits"
        )
    per = full // entries  # weight rows/columns per entry (1, or a block/group size)
    if start % per or size % per:
        raise ConfigError(
            f"tensor parallelism: {what}: the shard [{start}, {start + size}) splits a block "
            f"of {per}; use a --tp that keeps each rank's share a multiple of {per}"
        )
    return tensor.narrow(dim, start // per, size // per)


def column_shard(
    tensor: torch.Tensor, full_rows: int, start: int, size: int, what: str
) -> torch.Tensor:
    """Output rows [start, start + size) of one shard of a column-parallel layer."""
    if tensor.numel() == 1 or size == full_rows:
        return tensor
    return _cut(tensor, 0, full_rows, start, size, what)


def row_shard(
    tensor: torch.Tensor, full_cols: int, rank: int, size: int, what: str
) -> torch.Tensor:
    """Input columns of ``rank`` (of ``size``) in a row-parallel layer; per-output-row scales
    (1-D, or one column) are whole on every rank."""
    if tensor.dim() < 2 or tensor.shape[1] == 1:
        return tensor
    local = full_cols // size
    return _cut(tensor, 1, full_cols, rank * local, local, what)
