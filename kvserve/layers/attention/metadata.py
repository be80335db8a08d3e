"""Per-step description of a batch for attention over the paged KV cache.

A step runs B sequences. Their new tokens are flattened into T rows (prefill chunks and decodes
mixed, in batch order). Sequence i owns rows ``query_start_loc[i] : query_start_loc[i+1]``; its
KV history lives in the pages listed in ``block_tables[i]``.

    cache of seq i:  | cached/computed earlier ........ | new rows of this step |
                     0                    seq_len - query_len            seq_len

New row j of sequence i sits at position ``seq_lens[i] - query_len_i + j`` and attends causally
to cache positions ``0 .. that position`` (the new tokens are written to the cache first).

KV cache layout, one tensor per layer: ``[2, num_pages, page_size, num_kv_heads, head_dim]``
(index 0 = keys, 1 = values). Flat slot of a token = ``page * page_size + offset``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    query_start_loc: torch.Tensor  # int32 [B + 1]
    seq_lens: torch.Tensor  # int32 [B]: cache length of each sequence after this step
    block_tables: torch.Tensor  # int32 [B, max_pages]; unused tail entries are 0
    slot_mapping: torch.Tensor  # int64 [T]: flat cache slot for each new row
    max_query_len: int
    max_seq_len: int
    # Host copies, so backends that loop over sequences need no device->host sync.
    query_lens_cpu: list[int]
    seq_lens_cpu: list[int]

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1

    @property
    def num_leading_decodes(self) -> int:
        """Sequences at the front of the batch with one new row each (the scheduler puts
        decodes first, so a backend can run them through its decode kernel)."""
        n = 0
        for q in self.query_lens_cpu:
            if q != 1:
                break
            n += 1
        return n
