"""The KV pool: owns the paged KV memory of every layer.

One tensor per layer, ``[2, num_pages, page_size, num_kv_heads, head_dim]`` (0 = keys,
1 = values): the layout the attention backends and the Triton kernels read, handed to them one
layer at a time through ``layer(i)``. The pool also owns what describes that memory: its dtype,
its page geometry, per-layer k/v scales (FP8 KV is stored as e4m3 values that times the
layer's scale give the real ones; 1.0 for every other dtype), and copies of whole pages between
the device and host memory (the host tier and KV transfer move pages this way).

    page p of layer l:  layers[l][0, p]  keys   [page_size, Hkv, D]
                        layers[l][1, p]  values [page_size, Hkv, D]
    flat slot of a token = page * page_size + offset
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from kvserve.config import ModelConfig
from kvserve.kernels.store_kv_cache import (
    FP8_KV_DTYPE,
    KVScales,
    cache_keys,
    cache_values,
    decode_kv_reference,
    gather_kv_rows,
    raw_kv,
    store_kv_cache_reference,
)
from kvserve.kv_layout import (
    FP8_KV_CACHE_DTYPES,
    KV_CACHE_DTYPES,
    check_kv_cache_dtype,
    kv_bytes_per_token,
    pages_for,
)

SUPPORTED_DTYPES = KV_CACHE_DTYPES  # --kv-cache-dtype names; config validation reads the same


@dataclass(frozen=True)
class PageGeometry:
    num_layers: int
    num_pages: int
    page_size: int  # tokens per page
    num_kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, model: ModelConfig, num_pages: int, page_size: int) -> PageGeometry:
        return cls(model.num_layers, num_pages, page_size, model.num_kv_heads, model.head_dim)

    @property
    def layer_shape(self) -> tuple[int, int, int, int, int]:
        return (2, self.num_pages, self.page_size, self.num_kv_heads, self.head_dim)

    def pages_for(self, tokens: int) -> int:
        return pages_for(tokens, self.page_size)


def resolve_kv_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """The torch dtype the pool holds for a ``--kv-cache-dtype`` name."""
    check_kv_cache_dtype(name, str(model_dtype).removeprefix("torch."))
    return torch.float8_e4m3fn if name in FP8_KV_CACHE_DTYPES else model_dtype


class KVPool:
    def __init__(self, layers: list[torch.Tensor]) -> None:
        """A pool over per-layer tensors of one shape and dtype (see ``allocate``)."""
        _, num_pages, page_size, num_kv_heads, head_dim = layers[0].shape
        self.geometry = PageGeometry(len(layers), num_pages, page_size, num_kv_heads, head_dim)
        self.layers = layers
        self.dtype, self.device = layers[0].dtype, layers[0].device
        self.k_scales = torch.ones(len(layers), dtype=torch.float32, device=self.device)
        self.v_scales = torch.ones(len(layers), dtype=torch.float32, device=self.device)
        # Views the kernels read the scales through (set_scales writes into them in place, so
        # CUDA graphs captured earlier see new scales).
        self._scale_views = [
            (self.k_scales[i : i + 1], self.v_scales[i : i + 1]) for i in range(len(layers))
        ]

    @classmethod
    def allocate(
        cls,
        geometry: PageGeometry,
        dtype: torch.dtype,
        device: torch.device,
        *,
        one_tensor_for_all_layers: bool = False,
    ) -> KVPool:
        """Zeroed KV memory. ``one_tensor_for_all_layers``: every layer reads and writes the
        same tensor (a throw-away pool for measuring a step's activation memory)."""
        shape, n = geometry.layer_shape, geometry.num_layers
        if one_tensor_for_all_layers:
            return cls([_zeroed(shape, dtype, device)] * n)
        return cls([_zeroed(shape, dtype, device) for _ in range(n)])

    # -- geometry ---------------------------------------------------------------------------
    def layer(self, idx: int) -> torch.Tensor:
        return self.layers[idx]

    def scales(self, idx: int) -> KVScales | None:
        """Layer ``idx``'s (k_scale, v_scale) for the kernels of an FP8 pool; None otherwise."""
        return self._scale_views[idx] if self.is_fp8 else None

    @property
    def num_pages(self) -> int:
        return self.geometry.num_pages

    @property
    def page_size(self) -> int:
        return self.geometry.page_size

    def pages_for(self, tokens: int) -> int:
        return self.geometry.pages_for(tokens)

    @property
    def is_fp8(self) -> bool:
        return self.dtype == FP8_KV_DTYPE

    @property
    def bytes_per_token(self) -> int:
        g = self.geometry
        return kv_bytes_per_token(g.num_layers, g.num_kv_heads, g.head_dim, self.dtype.itemsize)

    @property
    def nbytes(self) -> int:
        return self.bytes_per_token * self.num_pages * self.page_size

    # -- values (the torch path; kernels read the layer tensors directly) -------------------
    def set_scales(self, idx: int, k_scale: float, v_scale: float) -> None:
        self.k_scales[idx], self.v_scales[idx] = k_scale, v_scale

    def store(self, idx: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        """Write keys/values ``[T, Hkv, D]`` of layer ``idx`` at flat ``slots`` (all >= 0),
        divided by the layer's scales and rounded to the pool's dtype."""
        scales = (self.k_scales[idx], self.v_scales[idx])
        store_kv_cache_reference(k, v, self.layers[idx], slots, scales)

    def load(
        self, idx: int, page_ids: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of layer ``idx`` in ``page_ids``, ``[n * page_size, Hkv, D]`` each,
        times the layer's scales, in ``dtype``."""
        cache, scales = self.layers[idx], (self.k_scales[idx], self.v_scales[idx])
        out = []
        for half, scale in zip((cache_keys(cache), cache_values(cache)), scales, strict=True):
            x = gather_kv_rows(half, page_ids).flatten(0, 1)
            out.append(decode_kv_reference(x, scale, dtype))
        return out[0], out[1]

    # -- page copies between device and host ------------------------------------------------
    def export_shape(self, num_pages: int) -> tuple[int, ...]:
        """``[num_layers, 2, num_pages, page_size, Hkv, D]``: what ``export_pages`` returns."""
        g = self.geometry
        return (g.num_layers, 2, num_pages, g.page_size, g.num_kv_heads, g.head_dim)

    def export_nbytes(self, num_pages: int) -> int:
        return math.prod(self.export_shape(num_pages)) * self.dtype.itemsize

    def export_pages(
        self, page_ids: list[int] | torch.Tensor, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Pages ``page_ids`` of every layer, copied to host memory (pinned on CUDA), as stored
        (FP8 stays FP8; the scales stay with the pool): ``[num_layers, 2, n, page_size, Hkv,
        D]``. Into ``out`` when given; a pinned ``out`` gets the copies queued without a wait
        (the caller syncs on the stream before it reads them)."""
        ids = torch.as_tensor(page_ids, dtype=torch.int64, device=self.device)
        shape = self.export_shape(len(ids))
        pin = self.device.type == "cuda"
        host = out if out is not None else torch.empty(shape, dtype=self.dtype, pin_memory=pin)
        if tuple(host.shape) != shape or host.dtype != self.dtype:
            raise ValueError(f"an export buffer of {tuple(host.shape)} {host.dtype} for "
                             f"{shape} {self.dtype}")  # fmt: skip
        queued = out is not None and pin and host.is_pinned()
        for i, cache in enumerate(self.layers):
            raw_kv(host[i]).copy_(raw_kv(cache).index_select(1, ids), non_blocking=queued)
        return host

    def import_pages(self, page_ids: list[int] | torch.Tensor, host: torch.Tensor) -> None:
        """The inverse of ``export_pages``: write ``host`` into pages ``page_ids``."""
        ids = torch.as_tensor(page_ids, dtype=torch.int64, device=self.device)
        g = self.geometry
        expected = (g.num_layers, 2, len(ids), g.page_size, g.num_kv_heads, g.head_dim)
        if tuple(host.shape) != expected or host.dtype != self.dtype:
            raise ValueError(
                f"pages of shape {tuple(host.shape)} {host.dtype} do not fit this pool "
                f"({expected} {self.dtype})"
            )
        for i, cache in enumerate(self.layers):
            src = raw_kv(host[i]).to(self.device, non_blocking=True)
            raw_kv(cache).index_copy_(1, ids, src)


def _zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    # calloc'd: the OS hands out zero pages as they are first touched, so a CPU pool costs no
    # memset at start (4.8 s for the bundled model's 1.5 GB on 2 cores) and no resident memory
    # for pages never used
    nbytes = math.prod(shape) * dtype.itemsize
    return torch.from_numpy(np.zeros(nbytes, dtype=np.uint8)).view(dtype).view(shape)
