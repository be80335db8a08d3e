"""The attention backend seam: one interface, picked once by a factory from config."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

import torch

from kvserve.errors import ConfigError
from kvserve.kernels.store_kv_cache import FP8_KV_DTYPE, KVScales
from kvserve.layers.attention.metadata import AttentionMetadata

if TYPE_CHECKING:
    from kvserve.layers.attention.cudnn_prefill import CudnnPrefill, GraphDims

log = logging.getLogger(__name__)


class AttentionBackend(Protocol):
    name: str
    prefill_attention: str  # what runs large prefill steps: the backend's own name, or "cudnn"
    fuses_rotary_store: bool  # takes k/v stored by the model's fused rotary kernel (``attend``)

    def forward(
        self,
        q: torch.Tensor,  # [T, num_heads, head_dim]
        k: torch.Tensor,  # [T, num_kv_heads, head_dim]
        v: torch.Tensor,  # [T, num_kv_heads, head_dim]
        kv_cache: torch.Tensor,  # [2, num_pages, page_size, num_kv_heads, head_dim]
        meta: AttentionMetadata,
        scale: float,
        kv_scales: KVScales | None = None,  # the layer's k/v scales; needed by an FP8 cache
    ) -> torch.Tensor:  # [T, num_heads, head_dim]
        """Write the new k/v at ``meta.slot_mapping``, then ``attend``."""
        ...

    def attend(
        self,
        q: torch.Tensor,  # [T, num_heads, head_dim]
        kv_cache: torch.Tensor,  # [2, num_pages, page_size, num_kv_heads, head_dim]
        meta: AttentionMetadata,
        scale: float,
        kv_scales: KVScales | None = None,
    ) -> torch.Tensor:  # [T, num_heads, head_dim]
        """Attend causally over the cache, which already holds this step's k/v."""
        ...


def create_attention_backend(
    name: str, device: torch.device, pdl: bool = False, prefill: CudnnPrefill | None = None
) -> AttentionBackend:
    """``name``: auto, torch or triton (``_resolve``). ``pdl``: launch the Triton kernels with
    programmatic dependent launch (sm_90+). ``prefill``: the library that takes the triton
    backend's large prefill steps (``create_prefill_library``)."""
    name = _resolve(name, device)
    if name == "torch":
        from kvserve.layers.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend()
    if name == "triton":
        if device.type != "cuda":
            raise ConfigError("the triton attention backend needs a CUDA device")
        from kvserve.layers.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend(pdl, prefill)
    raise ConfigError(f"unknown attention backend {name!r} (choose auto, torch or triton)")


def check_kv_cache_dtype_on_device(
    kv_dtype: torch.dtype, backend_name: str, device: torch.device
) -> None:
    """Refuse an FP8 KV cache where the triton backend cannot read it: its decode kernel runs
    on FP8 tensor cores (``fp8_decode_attention``), compute capability 8.9 and above."""
    if kv_dtype != FP8_KV_DTYPE or backend_name != "triton":
        return
    cc = torch.cuda.get_device_capability(device)
    if cc < (8, 9):
        raise ConfigError(
            f"--kv-cache-dtype fp8 with the triton attention backend needs FP8 tensor cores "
            f"(compute capability 8.9+); {torch.cuda.get_device_name(device)} is "
            f"{cc[0]}.{cc[1]}: use --kv-cache-dtype auto, or --attention-backend torch"
        )


def create_prefill_library(
    name: str,
    attention_backend: str,
    device: torch.device,
    dtype: torch.dtype,
    kv_dtype: torch.dtype,
    head_dim: int,
    dims: GraphDims,
) -> CudnnPrefill | None:
    """The prefill attention of the triton backend: ``triton`` (its own kernel), ``cudnn``
    (cuDNN's paged SDPA for large steps; refused where it cannot run) or ``auto`` (cuDNN where
    it can run, else the kernel). ``dims``: what the engine schedules (``GraphDims``)."""
    if name not in ("auto", "triton", "cudnn"):
        raise ConfigError(f"unknown prefill attention backend {name!r} (auto, triton or cudnn)")
    uses_triton = _resolve(attention_backend, device) == "triton"
    if name == "triton" or (name == "auto" and not uses_triton):
        return None
    if not uses_triton:
        raise ConfigError("--prefill-attention-backend cudnn needs the triton attention backend")
    from kvserve.layers.attention.cudnn_prefill import (
        MISSING_PACKAGE,
        CudnnPrefill,
        cudnn_prefill_unavailable,
    )

    reason = cudnn_prefill_unavailable(device, dtype, kv_dtype, head_dim)
    if reason is not None:
        if name == "cudnn":
            raise ConfigError(f"--prefill-attention-backend cudnn cannot run here: {reason}")
        # A node that could run it but lacks the package loses about 1.3x of long prefill:
        # a warning (as preflight's), not a line among the start's info
        report = log.warning if reason == MISSING_PACKAGE else log.info
        report("prefill attention: the Triton kernel (cuDNN not used: %s)", reason)
        return None
    log.info("prefill attention: cuDNN's paged SDPA for large steps, else the Triton kernel")
    return CudnnPrefill(device, dims)


def _resolve(name: str, device: torch.device) -> str:
    """The attention backend ``name`` stands for: ``auto`` is triton on CUDA when Triton is
    importable, torch otherwise."""
    if name != "auto":
        return name
    return "triton" if device.type == "cuda" and _triton_available() else "torch"


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
