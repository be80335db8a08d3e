"""The linear-method protocol: how a linear layer stores its weight, takes checkpoint tensors,
and multiplies by it. One method object serves every layer of its format; per-layer state
(weights, scales) lives on the layer as parameters or buffers.

A merged layer (q/k/v, gate/up) stacks shards along the output dimension; the checkpoint gives
each shard's tensors separately, named as the checkpoint names them (``weight``,
``weight_scale``, ``input_scale``, ...). ``load_param`` receives one tensor with its shard index.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Protocol

import torch

from kvserve.errors import ConfigError, ModelLoadError

if TYPE_CHECKING:
    from kvserve.layers.linear import Linear
    from kvserve.quant.fp8_activation import Fp8Activation, Fp8InputScheme
    from kvserve.quant.permuted_activation import PermutedActivation


class LinearMethod(Protocol):
    def create_weights(self, layer: Linear, dtype: torch.dtype) -> None:
        """Register the layer's parameters (shapes from ``layer.in_features``,
        ``layer.shard_sizes``); ``dtype`` is the model's activation dtype."""

    def checkpoint_params(self, layer: Linear) -> tuple[str, ...]:
        """Names every shard must receive from a checkpoint (the loader checks them)."""

    def load_param(self, layer: Linear, name: str, loaded: torch.Tensor, shard: int) -> None:
        """Copy one checkpoint tensor of shard ``shard`` into place; unknown names raise."""

    def process_after_loading(self, layer: Linear) -> None:
        """Called once after every tensor is in (or after dummy init): merge per-shard scales,
        quantize online, reorder for a kernel."""

    def init_dummy(self, layer: Linear, gen: torch.Generator) -> None:
        """Random parameters of the right shapes and dtypes (``--load-format dummy``)."""

    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W.T + bias`` in the model dtype."""

    def apply_gated(self, layer: Linear, x: torch.Tensor) -> torch.Tensor | None:
        """For a gate/up layer without bias (gate rows, then as many up rows): silu(gate) * up
        [T, I] from one launch (the word GEMV's ``gated`` mode) where the method runs x on the
        GEMV, else None (the caller then runs ``apply`` and the SiLU-mul)."""

    def apply_after_silu_mul(
        self, layer: Linear, gate_up: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor | None:
        """For a down projection: ``silu(gate) * up @ W.T + bias`` from the gate/up layer's
        output [T, 2I] where the method folds the SiLU-mul into a kernel it runs on x anyway
        (FP8's activation quantization), else None (the caller runs the SiLU-mul, then
        ``apply``)."""

    def fp8_input_scheme(self, layer: Linear, x: torch.Tensor) -> Fp8InputScheme | None:
        """How this step (``x``: the layer's input, or a tensor of its rows, device and dtype)
        would quantize x to e4m3 by a kernel of its own, for x's producer to do instead; None
        where x is not quantized that way (every method but FP8's)."""

    def apply_fp8(self, layer: Linear, x: Fp8Activation, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W.T + bias`` for an x quantized as ``fp8_input_scheme`` named; only the
        methods that name one receive it."""

    def step_order(self, layer: Linear, x: torch.Tensor) -> bool | None:
        """The K-step order (the asynchronous FP4 GEMM's ``bits``) this step (``x`` as for
        ``fp8_input_scheme``) would permute x into by a kernel of its own, for x's producer to
        write it in instead; None where x is taken as it is (every method but FP4's)."""

    def apply_permuted(
        self, layer: Linear, x: PermutedActivation, bias: torch.Tensor | None
    ) -> torch.Tensor:
        """``x @ W.T + bias`` for an x in the order ``step_order`` named; only the methods
        that name one receive it."""


def shard_rows(layer: Linear, shard: int) -> slice:
    """The output rows of shard ``shard`` in the merged weight."""
    offset = layer.shard_offsets[shard]
    return slice(offset, offset + layer.shard_sizes[shard])


def copy_checked(target: torch.Tensor, loaded: torch.Tensor, what: str) -> None:
    """``target.copy_(loaded)`` with a clear error on a shape mismatch."""
    if target.shape != loaded.shape:
        raise ModelLoadError(
            f"{what}: checkpoint shape {tuple(loaded.shape)}, expected {tuple(target.shape)}"
        )
    target.copy_(loaded)


def unknown_param(layer: Linear, name: str, method: str) -> ModelLoadError:
    return ModelLoadError(
        f"{layer.prefix or 'linear layer'}: checkpoint tensor {name!r} has no place in a "
        f"{method} layer (it takes {', '.join(layer.method.checkpoint_params(layer))})"
    )


def rows_from_env(name: str, default: int, limit: int) -> int:
    """A step-size threshold set by environment variable ``name`` (0..``limit`` tokens); a bad
    value is refused with one line."""
    value = os.environ.get(name, str(default))
    if not value.isdigit() or int(value) > limit:
        raise ConfigError(f"{name}={value!r}: expected a row count from 0 to {limit}")
    return int(value)


class SixteenBitInput:
    """The activation-quantization hooks of ``LinearMethod`` for a method that multiplies x as
    it comes (bf16 / fp16 / fp32): no kernel of its own quantizes x, so none can take the
    SiLU-mul, and x's producer has nothing to quantize for it."""

    def apply_after_silu_mul(
        self, layer: Linear, gate_up: torch.Tensor, bias: torch.Tensor | None
    ) -> None:
        return None

    def fp8_input_scheme(self, layer: Linear, x: torch.Tensor) -> None:
        return None

    def apply_fp8(self, layer: Linear, x: Fp8Activation, bias: torch.Tensor | None) -> torch.Tensor:
        raise TypeError(f"{type(self).__name__} takes no pre-quantized FP8 input")

    def step_order(self, layer: Linear, x: torch.Tensor) -> bool | None:
        return None

    def apply_permuted(
        self, layer: Linear, x: PermutedActivation, bias: torch.Tensor | None
    ) -> torch.Tensor:
        raise TypeError(refuses_permuted_input(self))


def refuses_permuted_input(method: object) -> str:
    """The error of a method that names no ``step_order`` and still receives x in one."""
    return f"{type(method).__name__} takes no input in the FP4 GEMM's step order"
