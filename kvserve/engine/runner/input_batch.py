"""Turns a batch plan into the tensors one forward pass needs (built on the host with numpy,
then copied to the device once)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from kvserve.engine.core.request import Request
from kvserve.engine.core.scheduler_output import ScheduledChunk, SchedulerOutput
from kvserve.engine.runner.device import to_device_packed
from kvserve.kv_layout import pages_for
from kvserve.layers.attention import AttentionMetadata


@dataclass
class ModelInputs:
    token_ids: torch.Tensor  # int64 [T]
    positions: torch.Tensor  # int64 [T]
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # int64 [S]: row of the last new token of each sampled chunk
    sampled_chunks: list[int]  # index into plan.chunks of each sampled row
    # Rows whose token is still being sampled by the step in flight (overlap scheduling):
    # token_ids holds 0 there until the runner fills them in on the device.
    pending_rows: list[int]
    pending_requests: list[Request]

    @property
    def samples_every_row(self) -> bool:
        """Every row samples (a decode-only step): sampled rows are increasing, so as many as
        there are rows means all of them, in order."""
        return len(self.sampled_chunks) == self.token_ids.shape[0]

    def sampled(self, hidden: torch.Tensor) -> torch.Tensor:
        """The rows of ``hidden`` that sample, without a gather where they are its first rows
        (hidden may run past them: a CUDA graph's padded batch)."""
        if self.samples_every_row:
            return hidden[: len(self.sampled_chunks)]
        return hidden[self.sample_rows]


@dataclass
class HostInputs:
    """A step's inputs as host arrays, before the copy to the device: plain data, so the
    tensor-parallel ranks receive exactly this (no request objects)."""

    token_ids: list[int]
    positions: np.ndarray  # int64 [T]
    row_starts: np.ndarray  # int32 [N + 1]
    seq_lens: np.ndarray  # int64 [N]
    tables: np.ndarray  # int32 [N, widest page table]
    slots: np.ndarray  # int64 [T]
    query_lens_cpu: list[int]
    seq_lens_cpu: list[int]
    sample_rows: list[int]
    sampled_chunks: list[int]
    pending_rows: list[int]


def build_model_inputs(plan: SchedulerOutput, page_size: int, device: torch.device) -> ModelInputs:
    host, pending_requests = build_host_inputs(plan, page_size)
    return device_inputs(host, device, pending_requests)


def build_host_inputs(plan: SchedulerOutput, page_size: int) -> tuple[HostInputs, list[Request]]:
    chunks = plan.chunks
    n = len(chunks)
    starts = np.fromiter((c.start for c in chunks), np.int64, n)
    query_lens = np.fromiter((c.num_new_tokens for c in chunks), np.int64, n)
    seq_lens = starts + query_lens
    num_pages = pages_for(seq_lens, page_size)
    # Page tables: the used prefix of each request's table, padded with 0 to the widest.
    tables = np.zeros((n, int(num_pages.max())), dtype=np.int32)
    used = np.arange(tables.shape[1])[None, :] < num_pages[:, None]
    tables[used] = np.fromiter(
        itertools.chain.from_iterable(
            c.request.block_table[:k] for c, k in zip(chunks, num_pages.tolist())
        ),
        np.int32,
        int(num_pages.sum()),
    )
    row_starts = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(query_lens, out=row_starts[1:])
    if int(row_starts[-1]) == n:  # decode-only: one row per sequence
        seq_of_row, positions = np.arange(n), starts
    else:
        seq_of_row = np.repeat(np.arange(n), query_lens)
        positions = np.arange(int(row_starts[-1])) - np.repeat(row_starts[:-1] - starts, query_lens)
    token_ids, pending_rows, pending_requests = _known_token_ids(chunks, row_starts)
    slots = tables[seq_of_row, positions // page_size].astype(np.int64) * page_size
    slots += positions % page_size
    sampled = [i for i, c in enumerate(chunks) if c.sample]
    host = HostInputs(
        token_ids=token_ids,
        positions=positions,
        row_starts=row_starts,
        seq_lens=seq_lens,
        tables=tables,
        slots=slots,
        query_lens_cpu=query_lens.tolist(),
        seq_lens_cpu=seq_lens.tolist(),
        sample_rows=[int(row_starts[i + 1]) - 1 for i in sampled],
        sampled_chunks=sampled,
        pending_rows=pending_rows,
    )
    return host, pending_requests


def device_inputs(
    host: HostInputs, device: torch.device, pending_requests: list[Request] | None = None
) -> ModelInputs:
    token_ids, positions, sample_rows, row_starts, seq_lens, tables, slots = to_device_packed(
        [
            (host.token_ids, torch.int64),
            (host.positions, torch.int64),
            (host.sample_rows, torch.int64),
            (host.row_starts, torch.int32),
            (host.seq_lens, torch.int32),
            (host.tables, torch.int32),
            (host.slots, torch.int64),
        ],
        device,
    )
    meta = AttentionMetadata(
        query_start_loc=row_starts,
        seq_lens=seq_lens,
        block_tables=tables,
        slot_mapping=slots,
        max_query_len=max(host.query_lens_cpu),
        max_seq_len=max(host.seq_lens_cpu),
        query_lens_cpu=host.query_lens_cpu,
        seq_lens_cpu=host.seq_lens_cpu,
    )
    return ModelInputs(
        token_ids=token_ids,
        positions=positions,
        meta=meta,
        sample_rows=sample_rows,
        sampled_chunks=host.sampled_chunks,
        pending_rows=host.pending_rows,
        pending_requests=pending_requests or [],
    )


def _known_token_ids(
    chunks: list[ScheduledChunk], row_starts: np.ndarray
) -> tuple[list[int], list[int], list[Request]]:
    """Token id of every row, 0 where the token is pending (only ever a chunk's last row: a
    request with a token in flight has computed all its known tokens)."""
    token_ids: list[int] = []
    pending_rows: list[int] = []
    pending_requests: list[Request] = []
    for i, c in enumerate(chunks):
        r, end = c.request, c.start + c.num_new_tokens
        if end == c.start + 1 and c.start < r.num_tokens:  # a decode row, the common case
            token_ids.append(r.token_at(c.start))
        elif end <= r.num_tokens:
            token_ids.extend(r.token_ids(c.start, end))
        else:
            token_ids.extend(r.token_ids(c.start, end - 1))
            token_ids.append(0)
            pending_rows.append(int(row_starts[i + 1]) - 1)
            pending_requests.append(r)
    return token_ids, pending_rows, pending_requests


def fill_pending_rows(inputs: ModelInputs, src_rows: list[int], sampled: torch.Tensor) -> None:
    """Copy ``sampled[src_rows]`` (the step in flight's sampled ids) into this step's pending
    rows, on the device."""
    pairs = [(src_rows, torch.int64), (inputs.pending_rows, torch.int64)]
    src, dst = to_device_packed(pairs, inputs.token_ids.device)
    inputs.token_ids.index_copy_(0, dst, sampled.index_select(0, src))
