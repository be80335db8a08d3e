"""Turns a batch plan into the tensors one forward pass needs (built on the host with numpy,
then copied to the device once)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kvserve.engine.scheduler_output import SchedulerOutput
from kvserve.layers.attention import AttentionMetadata


@dataclass
class ModelInputs:
    token_ids: torch.Tensor  # int64 [T]
    positions: torch.Tensor  # int64 [T]
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # int64 [S]: row of the last new token of each sampled chunk
    sampled_chunks: list[int]  # index into plan.chunks of each sampled row


def build_model_inputs(plan: SchedulerOutput, page_size: int, device: torch.device) -> ModelInputs:
    chunks = plan.chunks
    query_lens = [c.num_new_tokens for c in chunks]
    seq_lens = [c.start + c.num_new_tokens for c in chunks]
    max_pages = max(-(-s // page_size) for s in seq_lens)
    tables = np.zeros((len(chunks), max_pages), dtype=np.int32)
    token_ids, positions, slots = [], [], []
    for i, c in enumerate(chunks):
        table = c.request.block_table
        n_pages = -(-seq_lens[i] // page_size)
        tables[i, :n_pages] = table[:n_pages]
        pos = np.arange(c.start, c.start + c.num_new_tokens)
        positions.append(pos)
        slots.append(tables[i][pos // page_size].astype(np.int64) * page_size + pos % page_size)
        token_ids.extend(c.request.token_ids(c.start, c.start + c.num_new_tokens))
    starts = np.zeros(len(chunks) + 1, dtype=np.int32)
    np.cumsum(query_lens, out=starts[1:])
    sampled = [i for i, c in enumerate(chunks) if c.sample]

    def to_dev(a: np.ndarray | list[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.as_tensor(np.asarray(a), dtype=dtype).to(device, non_blocking=True)

    meta = AttentionMetadata(
        query_start_loc=to_dev(starts, torch.int32),
        seq_lens=to_dev(seq_lens, torch.int32),
        block_tables=to_dev(tables, torch.int32),
        slot_mapping=to_dev(np.concatenate(slots), torch.int64),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        query_lens_cpu=query_lens,
        seq_lens_cpu=seq_lens,
    )
    return ModelInputs(
        token_ids=to_dev(token_ids, torch.int64),
        positions=to_dev(np.concatenate(positions), torch.int64),
        meta=meta,
        sample_rows=to_dev([int(starts[i + 1]) - 1 for i in sampled], torch.int64),
        sampled_chunks=sampled,
    )
