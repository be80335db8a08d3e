"""What one prefill hands one decode: a header (msgspec) and the prompt's KV pages as stored,
``[num_layers, 2, num_pages, page_size, num_kv_heads, head_dim]`` (``KVPool.export_pages``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec
import torch

from kvserve.disagg.staging import Staged
from kvserve.engine.core.outputs import TokenLogprobs


class KVHeader(msgspec.Struct):
    room: str
    prompt_token_ids: list[int]
    first_token_id: int
    first_logprob: TokenLogprobs | None
    num_cached_tokens: int  # prompt tokens the prefill side served from its prefix cache
    dtype: str  # torch dtype name of the pages, e.g. "float32", "float8_e4m3fn"
    shape: list[int]
    k_scales: list[float]  # per layer (1.0 unless the KV is FP8)
    v_scales: list[float]
    nbytes: int


@dataclass
class PrefilledKV:
    header: KVHeader
    pages: torch.Tensor  # host memory, contiguous
    staged: Staged | None = None  # the staging buffer ``pages`` views, given back by release()
    ready: Any = None  # a CUDA event: the copies into ``pages`` are done once it is
    seconds: dict[str, float] = field(default_factory=dict)  # where the time went, for logs

    def raw(self) -> torch.Tensor:
        """The pages as a flat byte tensor (what goes over the wire)."""
        return self.pages.reshape(-1).view(torch.uint8)

    def wait_ready(self) -> None:
        if self.ready is not None:
            self.ready.synchronize()

    def release(self, event: Any = None) -> None:
        """Done with the pages (``event``: after the last GPU copy that reads them)."""
        if self.staged is not None:
            self.staged.give_back(event)
            self.staged = None


def torch_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown KV dtype {name!r}")
    return dtype


def empty_pages(header: KVHeader) -> torch.Tensor:
    """A host buffer for the header's pages, as flat bytes."""
    return torch.empty(header.nbytes, dtype=torch.uint8)


def pages_from_raw(header: KVHeader, raw: torch.Tensor) -> torch.Tensor:
    return raw.view(torch_dtype(header.dtype)).view(header.shape)


_encoder = msgspec.msgpack.Encoder()
_header_decoder = msgspec.msgpack.Decoder(KVHeader)


def encode_header(header: KVHeader) -> bytes:
    return _encoder.encode(header)


def decode_header(data: bytes) -> KVHeader:
    return _header_decoder.decode(data)
