"""Which kernels a model runs, chosen once by the model runner and passed to the model when it
is built (every layer with a Triton kernel holds the same object)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelOptions:
    # Layers with a Triton kernel (norms, rotary, SiLU-mul, the fused rotary + KV store) run it
    # instead of their torch reference. On with the triton attention backend.
    triton: bool = False
    # Programmatic dependent launch of those kernels (sm_90+; see kvserve.kernels._triton).
    pdl: bool = False


TORCH_REFERENCE = KernelOptions()
