"""The linear method of both FP4 formats: weight-only, the weight kept packed on the layer
(``weight_packed``, ``weight_scale``, and for NVFP4 ``weight_row_scale``) and multiplied by the
fused Triton GEMM on GPU, by its torch reference on CPU (``kvserve.kernels.fp4_gemm``).

A format (``Fp4Format``) says, per checkpoint layout, which tensor names a shard receives and
how each becomes rows of the layer's tensors (a ``Reader``). Online quantization is one more
layout whose only tensor is the float ``weight``, quantized shard by shard as it arrives, so the
float weight of a whole model is never held.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from kvserve.errors import ModelLoadError
from kvserve.kernels._triton import sm_count
from kvserve.kernels.activation import silu_and_mul
from kvserve.kernels.fp4_async_choice import (
    async_bits_enabled,
    async_choice,
    async_gemm_enabled,
    permute_in_producer,
    weight_fits,
)
from kvserve.kernels.fp4_gemm import GEMV_MAX_ROWS, fp4_linear
from kvserve.kernels.fp4_reference import dequantize_fp4, group_size_of
from kvserve.quant.method import SixteenBitInput, copy_checked, shard_rows, unknown_param

if TYPE_CHECKING:
    from kvserve.layers.linear import Linear
    from kvserve.quant.permuted_activation import PermutedActivation

# (checkpoint tensor of one shard, the shard's row count) -> {layer tensor name: its rows}
Reader = Callable[[torch.Tensor, int], dict[str, torch.Tensor]]
ScaleMaker = Callable[[int, int, torch.Generator], dict[str, torch.Tensor]]
_CPU_DENSE = "_fp4_cpu_dense"  # plain attribute, not a parameter: state_dict stays packed
# plain attribute: the asynchronous GEMM can take the weight (``weight_fits``, set at load)
_ASYNC_WEIGHT = "_fp4_async_weight"


def packed_rows(loaded: torch.Tensor, rows: int) -> dict[str, torch.Tensor]:
    """Packed E2M1 bytes [rows, K/2] (or gpt-oss blocks [rows, K/32, 16])."""
    if loaded.dtype != torch.uint8:
        raise ValueError(f"packed FP4 weights are uint8, got {loaded.dtype}")
    return {"weight_packed": loaded.reshape(rows, -1)}


def ignored(loaded: torch.Tensor, rows: int) -> dict[str, torch.Tensor]:
    """Activation scales: weight-only FP4 keeps activations in the model dtype."""
    return {}


@dataclass(frozen=True)
class Fp4Format:
    name: str
    group: int  # K values per block scale
    scale_dtype: torch.dtype
    has_row_scale: bool
    layouts: Mapping[str, Mapping[str, Reader]]  # layout -> checkpoint name -> reader
    optional: tuple[str, ...]  # names a checkpoint may omit
    dummy_scales: ScaleMaker  # (rows, groups, generator) -> sane random scales


class Fp4LinearMethod(SixteenBitInput):
    def __init__(self, fmt: Fp4Format, layout: str) -> None:
        if layout not in fmt.layouts:
            raise ModelLoadError(
                f"{fmt.name}: no reader for the {layout} layout "
                f"(kvserve reads {', '.join(fmt.layouts)})"
            )
        self.format, self.layout = fmt, layout
        self.readers = fmt.layouts[layout]

    def create_weights(self, layer: Linear, dtype: torch.dtype) -> None:
        n, k = layer.out_features, layer.in_features
        if k % self.format.group:
            raise ModelLoadError(
                f"{layer.prefix}: {self.format.name} needs in_features a multiple of "
                f"{self.format.group}, got {k}"
            )
        scale_shape = (n, k // self.format.group)
        layer.weight_packed = nn.Parameter(torch.zeros(n, k // 2, dtype=torch.uint8), False)
        layer.weight_scale = nn.Parameter(
            torch.zeros(scale_shape, dtype=self.format.scale_dtype), False
        )
        layer.weight_row_scale = (
            nn.Parameter(torch.ones(n, dtype=torch.float32), False)
            if self.format.has_row_scale
            else None
        )

    def checkpoint_params(self, layer: Linear) -> tuple[str, ...]:
        return tuple(name for name in self.readers if name not in self.format.optional)

    def load_param(self, layer: Linear, name: str, loaded: torch.Tensor, shard: int) -> None:
        reader = self.readers.get(name)
        if reader is None:
            raise unknown_param(layer, name, f"{self.format.name} ({self.layout})")
        rows = shard_rows(layer, shard)
        try:
            tensors = reader(loaded, rows.stop - rows.start)
        except ValueError as exc:
            raise ModelLoadError(f"{layer.prefix}.{name}[{shard}]: {exc}") from exc
        layer.__dict__.pop(_CPU_DENSE, None)
        for target, value in tensors.items():
            param = getattr(layer, target)
            copy_checked(param.data[rows], value.to(param.device), f"{layer.prefix}.{name}")

    def process_after_loading(self, layer: Linear) -> None:
        layer.__dict__.pop(_CPU_DENSE, None)
        _mark_async_weight(layer)

    def init_dummy(self, layer: Linear, gen: torch.Generator) -> None:
        """Random codes; scales that keep |W| near the unquantized dummy's 0.02."""
        packed = layer.weight_packed
        codes = torch.randint(0, 256, packed.shape, generator=gen, device=gen.device)
        packed.data.copy_(codes.to(torch.uint8))
        scales = self.format.dummy_scales(packed.shape[0], layer.weight_scale.shape[1], gen)
        for target, value in scales.items():
            getattr(layer, target).data.copy_(value)
        _mark_async_weight(layer)

    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if x.device.type == "cpu":
            return F.linear(x, _cpu_dense(layer, x.dtype), bias)
        return fp4_linear(
            x, layer.weight_packed, layer.weight_scale, layer.weight_row_scale, bias,
            pdl=layer.launch_pdl, async_weight=layer.__dict__.get(_ASYNC_WEIGHT, False),
        )  # fmt: skip

    def step_order(self, layer: Linear, x: torch.Tensor) -> bool | None:
        """The asynchronous GEMM's ``bits`` where it takes a step of ``x``'s rows (a weight it
        fits, by ``KVSERVE_FP4_ASYNC``) and x's producer is to permute
        (``KVSERVE_FP4_PERMUTE_IN_PRODUCER``); else None."""
        if not layer.__dict__.get(_ASYNC_WEIGHT, False) or not permute_in_producer():
            return None
        n, k = layer.weight_packed.shape[0], layer.weight_packed.shape[1] * 2
        flat = x.reshape(-1, x.shape[-1])
        group = group_size_of(layer.weight_scale)
        cfg = async_choice(flat, n, k, sm_count(x.device), from_producer_group=group)
        return None if cfg is None else cfg.bits

    def apply_permuted(
        self, layer: Linear, x: PermutedActivation, bias: torch.Tensor | None
    ) -> torch.Tensor:
        return self._async_permuted(layer, x.values, x.bits, bias)

    def apply_after_silu_mul(
        self, layer: Linear, gate_up: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor | None:
        """silu(gate) * up written in the asynchronous GEMM's step order by the SiLU-mul
        kernel, where that GEMM takes the step; else None."""
        bits = self.step_order(layer, gate_up)
        if bits is None:
            return None
        flat = gate_up.reshape(-1, gate_up.shape[-1])
        hidden = silu_and_mul(flat, pdl=layer.launch_pdl, step_order=bits)
        y = self._async_permuted(layer, hidden, bits, bias)
        return y.view(*gate_up.shape[:-1], y.shape[-1])

    def _async_permuted(
        self, layer: Linear, x: torch.Tensor, bits: bool, bias: torch.Tensor | None
    ) -> torch.Tensor:
        return fp4_linear(
            x, layer.weight_packed, layer.weight_scale, layer.weight_row_scale, bias,
            pdl=layer.launch_pdl, async_weight=True, x_step_order=bits,
        )  # fmt: skip

    def apply_gated(self, layer: Linear, x: torch.Tensor) -> torch.Tensor | None:
        if x.device.type == "cpu" or x.numel() > GEMV_MAX_ROWS * x.shape[-1]:
            return None
        return fp4_linear(
            x, layer.weight_packed, layer.weight_scale, layer.weight_row_scale,
            pdl=layer.launch_pdl, gated=True,
        )  # fmt: skip


def _mark_async_weight(layer: Linear) -> None:
    """Whether the asynchronous GEMM takes this weight, found once at load; only where it may
    run, since the check reads the scales back (a host sync a layer)."""
    fits = async_gemm_enabled(layer.weight_packed.device) and weight_fits(
        layer.weight_packed, layer.weight_scale, bits=async_bits_enabled()
    )
    layer.__dict__[_ASYNC_WEIGHT] = fits


def _cpu_dense(layer: Linear, dtype: torch.dtype) -> torch.Tensor:
    """On CPU the torch reference runs: dequantize, then matmul. The dense weight is kept on
    the layer after the first call (reloading drops it), since unpacking every weight at every
    step would make the CPU path, which is for tests and the embedded default, crawl."""
    dense = layer.__dict__.get(_CPU_DENSE)
    if dense is None or dense.dtype != dtype:
        packed, scale, row = layer.weight_packed, layer.weight_scale, layer.weight_row_scale
        dense = dequantize_fp4(packed, scale, row, dtype)
        layer.__dict__[_CPU_DENSE] = dense
    return dense
