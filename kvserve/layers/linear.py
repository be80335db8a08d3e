"""A linear layer that delegates storage, loading and the matmul to its quant method
(``kvserve.quant``), so weight formats slot in without touching models. A merged layer (q/k/v
or gate/up) stacks several checkpoint tensors along its output dimension; ``load_shard`` routes
each checkpoint tensor of a shard (weight, scales, zero points, input scales) to the method."""

from __future__ import annotations

import torch
from torch import nn

from kvserve.errors import ModelLoadError
from kvserve.quant.fp8_activation import Fp8Activation, Fp8InputScheme
from kvserve.quant.method import LinearMethod
from kvserve.quant.permuted_activation import PermutedActivation
from kvserve.quant.unquantized import UnquantizedLinearMethod


class Linear(nn.Module):
    """``out_features = sum(shard_sizes)``; a plain layer has one shard. ``prefix`` is the
    layer's name, for error messages."""

    def __init__(
        self,
        in_features: int,
        shard_sizes: list[int],
        bias: bool,
        dtype: torch.dtype,
        method: LinearMethod | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.shard_sizes = shard_sizes
        self.shard_offsets = [sum(shard_sizes[:i]) for i in range(len(shard_sizes))]
        self.out_features = sum(shard_sizes)
        self.prefix = prefix
        # The method's own Triton kernels (the low-bit GEMV) launch with programmatic
        # dependent launch; the model sets it from ``KernelOptions.pdl`` (decoder._linear).
        self.launch_pdl = False
        self.method = method or UnquantizedLinearMethod()
        self.method.create_weights(self, dtype)
        self.bias = (
            nn.Parameter(torch.empty(self.out_features, dtype=dtype), False) if bias else None
        )
        self._loaded: set[tuple[str, int]] = set()

    def load_shard(self, param_name: str, loaded: torch.Tensor, shard: int = 0) -> None:
        if param_name == "bias":
            if self.bias is None:
                raise ModelLoadError(f"{self.prefix}: checkpoint has a bias this layer does not")
            offset, size = self.shard_offsets[shard], self.shard_sizes[shard]
            self.bias.data[offset : offset + size].copy_(loaded)
        else:
            self.method.load_param(self, param_name, loaded, shard)
        self._loaded.add((param_name, shard))

    def missing(self) -> list[str]:
        """Checkpoint tensors this layer still lacks, as ``name[shard]``."""
        names = self.method.checkpoint_params(self) + (("bias",) if self.bias is not None else ())
        return [
            f"{self.prefix}.{n}[{s}]"
            for n in names
            for s in range(len(self.shard_sizes))
            if (n, s) not in self._loaded
        ]

    def finish_loading(self) -> None:
        self.method.process_after_loading(self)

    def init_dummy(self, gen: torch.Generator) -> None:
        self.method.init_dummy(self, gen)
        if self.bias is not None:
            self.bias.data.uniform_(-0.02, 0.02, generator=gen)
        self.finish_loading()

    def forward(self, x: torch.Tensor | Fp8Activation | PermutedActivation) -> torch.Tensor:
        if isinstance(x, Fp8Activation):  # quantized by its producer, as fp8_input_scheme asked
            return self.method.apply_fp8(self, x, self.bias)
        if isinstance(x, PermutedActivation):  # permuted by its producer, as step_order asked
            return self.method.apply_permuted(self, x, self.bias)
        return self.method.apply(self, x, self.bias)

    def step_order(self, x: torch.Tensor) -> bool | None:
        """The asynchronous FP4 GEMM's K-step order this layer's method would permute ``x``
        (or an input of its rows, device and dtype) into by a kernel of its own, for x's
        producer to write it in instead; None where it takes x as it is."""
        return self.method.step_order(self, x)

    def fp8_input_scheme(self, x: torch.Tensor) -> Fp8InputScheme | None:
        """How this layer's method would quantize ``x`` (or an input of its rows, device and
        dtype) to e4m3 by a kernel of its own, for x's producer to do instead; None where it
        takes x as it is."""
        return self.method.fp8_input_scheme(self, x)

    def forward_after_silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor | None:
        """This layer of ``silu(gate) * up`` from a gate/up output in fewer launches, or None
        (``apply_after_silu_mul``)."""
        return self.method.apply_after_silu_mul(self, gate_up, self.bias)

    def forward_gated(self, x: torch.Tensor) -> torch.Tensor | None:
        """silu(gate) * up of a gate/up layer in one launch, or None (``apply_gated``)."""
        if self.bias is not None or len(self.shard_sizes) != 2:
            return None
        return self.method.apply_gated(self, x)
