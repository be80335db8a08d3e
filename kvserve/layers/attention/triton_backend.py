"""Attention on GPU through the Triton kernels in ``kvserve/kernels``.

Same contract as ``TorchAttentionBackend`` (its reference): store the new k/v, then one decode
kernel when every sequence has one new row, else the decode kernel for a mixed step's leading
decodes and one variable-length prefill kernel for its chunks (or cuDNN's paged SDPA, when the
engine enabled it and the chunks' attention is large: ``cudnn_prefill``). ``attend`` is the
second half alone, for callers that stored k/v themselves (``kvserve.kernels.rotary_store_kv``).
No host syncs: only ``meta``'s tensors and host ints.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kvserve.kernels.decode_attention import paged_decode_attention
from kvserve.kernels.prefill_attention import paged_prefill_attention
from kvserve.kernels.store_kv_cache import KVScales, store_kv_cache
from kvserve.layers.attention.metadata import AttentionMetadata

if TYPE_CHECKING:
    from kvserve.layers.attention.cudnn_prefill import CudnnPrefill


class TritonAttentionBackend:
    name = "triton"
    # The model may store k/v itself with rotary fused in (kvserve.kernels.rotary_store_kv)
    # and call ``attend``.
    fuses_rotary_store = True

    def __init__(self, pdl: bool = False, prefill: CudnnPrefill | None = None) -> None:
        self.pdl = pdl  # programmatic dependent launch of the kernels (sm_90+)
        self.prefill_library = prefill  # takes the prefill steps it finds large enough

    @property
    def prefill_attention(self) -> str:
        return self.name if self.prefill_library is None else "cudnn"

    def forward(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        kv_cache: torch.Tensor,  # [2, num_pages, page_size, Hkv, D]
        meta: AttentionMetadata,
        scale: float,
        kv_scales: KVScales | None = None,
    ) -> torch.Tensor:  # [T, Hq, D]
        store_kv_cache(k, v, kv_cache, meta.slot_mapping, kv_scales, pdl=self.pdl)
        return self.attend(q, kv_cache, meta, scale, kv_scales)

    def attend(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        kv_cache: torch.Tensor,  # [2, num_pages, page_size, Hkv, D]; this step's k/v stored
        meta: AttentionMetadata,
        scale: float,
        kv_scales: KVScales | None = None,
    ) -> torch.Tensor:  # [T, Hq, D]
        if meta.is_decode_only:
            # T == B: row i is sequence i's single new token.
            return paged_decode_attention(
                q, kv_cache, meta.block_tables, meta.seq_lens, scale, None, kv_scales,
                pdl=self.pdl,
            )  # fmt: skip
        nd = meta.num_leading_decodes
        if nd == 0:
            return self._prefill(q, kv_cache, meta.query_start_loc, meta, 0, scale, kv_scales)
        # Mixed step: decode rows [0, nd) through the decode kernel (a prefill tile would spend
        # a whole block of query rows on each of them), the prefill chunks after them.
        out = torch.empty_like(q)
        paged_decode_attention(
            q[:nd],
            kv_cache,
            meta.block_tables[:nd],
            meta.seq_lens[:nd],
            scale,
            out=out[:nd],
            kv_scales=kv_scales,
            pdl=self.pdl,
        )
        starts = meta.query_start_loc[nd:] - nd
        out[nd:] = self._prefill(q[nd:], kv_cache, starts, meta, nd, scale, kv_scales)
        return out

    def _prefill(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        query_start_loc: torch.Tensor,
        meta: AttentionMetadata,
        first_seq: int,
        scale: float,
        kv_scales: KVScales | None,
    ) -> torch.Tensor:
        if self.prefill_library is not None:
            inputs = self.prefill_library.step_inputs(meta, first_seq)
            if inputs is not None:
                return self.prefill_library(q, kv_cache, inputs, scale)
        return paged_prefill_attention(
            q,
            kv_cache,
            query_start_loc,
            meta.seq_lens[first_seq:],
            meta.block_tables[first_seq:],
            meta.max_query_len,
            scale,
            kv_scales,
            max_seq_len=meta.max_seq_len,
        )
