"""Linear layers that take a quant-method object, so weight formats slot in without touching
models. A merged layer (q/k/v or gate/up) stacks several checkpoint tensors along its output
dimension; ``load_shard`` copies one of them into place."""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn


class LinearMethod(Protocol):
    """How a linear layer stores its weight and multiplies by it."""

    def create_weights(
        self, layer: nn.Module, in_features: int, out_features: int, dtype: torch.dtype
    ) -> None: ...

    def load_shard(
        self, layer: nn.Module, loaded: torch.Tensor, offset: int, size: int
    ) -> None: ...

    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor: ...


class UnquantizedLinearMethod:
    """Dense weight in the model dtype: ``y = x @ W.T + b``."""

    def create_weights(
        self, layer: nn.Module, in_features: int, out_features: int, dtype: torch.dtype
    ) -> None:
        layer.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype), False)

    def load_shard(self, layer: nn.Module, loaded: torch.Tensor, offset: int, size: int) -> None:
        target = layer.weight.data[offset : offset + size]
        if target.shape != loaded.shape:
            raise ValueError(
                f"weight shape {tuple(loaded.shape)} != expected {tuple(target.shape)}"
            )
        target.copy_(loaded)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, layer.weight, bias)


class Linear(nn.Module):
    """``out_features = sum(shard_sizes)``; a plain layer has one shard."""

    def __init__(
        self,
        in_features: int,
        shard_sizes: list[int],
        bias: bool,
        dtype: torch.dtype,
        method: LinearMethod | None = None,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.shard_sizes = shard_sizes
        self.shard_offsets = [sum(shard_sizes[:i]) for i in range(len(shard_sizes))]
        self.out_features = sum(shard_sizes)
        self.method = method or UnquantizedLinearMethod()
        self.method.create_weights(self, in_features, self.out_features, dtype)
        self.bias = (
            nn.Parameter(torch.empty(self.out_features, dtype=dtype), False) if bias else None
        )

    def load_shard(self, param_name: str, loaded: torch.Tensor, shard: int = 0) -> None:
        offset, size = self.shard_offsets[shard], self.shard_sizes[shard]
        if param_name == "bias":
            if self.bias is None:
                raise ValueError("checkpoint has a bias this layer does not")
            self.bias.data[offset : offset + size].copy_(loaded)
        else:
            self.method.load_shard(self, loaded, offset, size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(self, x, self.bias)
