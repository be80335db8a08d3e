"""Reference attention backend in plain torch: runs on CPU and GPU, and is what every fast
kernel is tested against. Decode rows are batched into one padded SDPA call; prefill chunks
are attended one sequence at a time."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvserve.kernels.store_kv_cache import (
    KVScales,
    cache_keys,
    cache_values,
    check_kv_scales,
    decode_kv_reference,
    gather_kv_rows,
    store_kv_cache_reference,
)
from kvserve.kv_layout import pages_for
from kvserve.layers.attention.metadata import AttentionMetadata


def gather_pages(
    kv_cache: torch.Tensor,
    pages: torch.Tensor,
    dtype: torch.dtype,
    kv_scales: KVScales | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of ``pages``, [len(pages), page_size, Hkv, D] each, in ``dtype`` (an FP8
    cache is scaled back)."""
    check_kv_scales(kv_cache, kv_scales)
    out = []
    for i, half in enumerate((cache_keys(kv_cache), cache_values(kv_cache))):
        x = gather_kv_rows(half, pages)
        out.append(decode_kv_reference(x, kv_scales[i], dtype) if kv_scales else x.to(dtype))
    return out[0], out[1]


def gather_sequence_kv(
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_len: int,
    dtype: torch.dtype,
    kv_scales: KVScales | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of one sequence, [seq_len, Hkv, D] each, read through its page table."""
    pages = block_table[: pages_for(seq_len, kv_cache.shape[2])]
    k, v = gather_pages(kv_cache, pages, dtype, kv_scales)
    return k.flatten(0, 1)[:seq_len], v.flatten(0, 1)[:seq_len]


class TorchAttentionBackend:
    name = "torch"
    prefill_attention = "torch"
    fuses_rotary_store = False

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        kv_scales: KVScales | None = None,
    ) -> torch.Tensor:
        store_kv_cache_reference(k, v, kv_cache, meta.slot_mapping, kv_scales)
        return self.attend(q, kv_cache, meta, scale, kv_scales)

    def attend(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        kv_scales: KVScales | None = None,
    ) -> torch.Tensor:
        if meta.is_decode_only:
            seqs = list(range(meta.num_seqs))
            return self._decode(q, kv_cache, meta, seqs, scale, kv_scales)
        out = torch.empty_like(q)
        starts = [0]
        for n in meta.query_lens_cpu:
            starts.append(starts[-1] + n)
        decode_seqs = [i for i, n in enumerate(meta.query_lens_cpu) if n == 1]
        if decode_seqs:
            rows = [starts[i] for i in decode_seqs]
            out[rows] = self._decode(q[rows], kv_cache, meta, decode_seqs, scale, kv_scales)
        for i, n in enumerate(meta.query_lens_cpu):
            if n > 1:
                rows_i = slice(starts[i], starts[i] + n)
                out[rows_i] = self._prefill_one(q[rows_i], kv_cache, meta, i, scale, kv_scales)
        return out

    def _decode(
        self,
        q: torch.Tensor,  # [b, Hq, D], one row per decoding sequence
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        seqs: list[int],
        scale: float,
        kv_scales: KVScales | None,
    ) -> torch.Tensor:
        page_size = kv_cache.shape[2]
        seq_lens = [meta.seq_lens_cpu[i] for i in seqs]
        max_len = max(seq_lens)
        num_pages = pages_for(max_len, page_size)
        tables = meta.block_tables[seqs, :num_pages].flatten()
        b, (hkv, d) = len(seqs), kv_cache.shape[-2:]
        # [b * pages, page_size, Hkv, D] -> [b, Hkv, L, D]
        keys, values = gather_pages(kv_cache, tables, q.dtype, kv_scales)
        keys = keys.view(b, -1, hkv, d).transpose(1, 2)
        values = values.view(b, -1, hkv, d).transpose(1, 2)
        lens = torch.tensor(seq_lens, device=q.device)
        valid = torch.arange(keys.shape[2], device=q.device)[None, :] < lens[:, None]
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2),  # [b, Hq, 1, D]
            keys,
            values,
            attn_mask=valid[:, None, None, :],
            scale=scale,
            enable_gqa=True,
        )
        return out.squeeze(2)

    def _prefill_one(
        self,
        q: torch.Tensor,  # [n, Hq, D]
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        i: int,
        scale: float,
        kv_scales: KVScales | None,
    ) -> torch.Tensor:
        seq_len, n = meta.seq_lens_cpu[i], q.shape[0]
        k, v = gather_sequence_kv(kv_cache, meta.block_tables[i], seq_len, q.dtype, kv_scales)
        qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        if seq_len == n:
            out = F.scaled_dot_product_attention(
                qh, kh, vh, is_causal=True, scale=scale, enable_gqa=True
            )
        else:
            # Row j sits at position seq_len - n + j and sees keys up to it.
            pos = torch.arange(seq_len - n, seq_len, device=q.device)
            mask = torch.arange(seq_len, device=q.device)[None, :] <= pos[:, None]
            out = F.scaled_dot_product_attention(
                qh, kh, vh, attn_mask=mask, scale=scale, enable_gqa=True
            )
        return out.transpose(0, 1)
