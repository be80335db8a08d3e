"""CUDA graphs of decode-only forward passes at a set of batch sizes.

A decode step launches hundreds of small kernels; replaying a captured graph removes their
launch overhead. Each captured size reads its inputs from static buffers; a batch of ``b`` rows
is padded up to the next captured size ``bs`` (padding rows: slot -1 so nothing is stored,
sequence length 0 so nothing is read). Prefill and mixed steps stay eager.
"""

from __future__ import annotations

import logging

import torch

from kvserve.engine.runner.input_batch import ModelInputs
from kvserve.engine.runner.kv_pool import KVPool
from kvserve.layers.attention import AttentionBackend, AttentionMetadata
from kvserve.models.forward_context import ForwardContext

log = logging.getLogger("kvserve.cuda_graphs")


def capture_sizes(max_bs: int) -> list[int]:
    sizes = [s for s in (1, 2, 4, 8) if s <= max_bs]
    sizes += list(range(16, max_bs + 1, 16))
    if sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sizes


class DecodeGraphs:
    def __init__(
        self,
        model: torch.nn.Module,
        kv: KVPool,
        backend: AttentionBackend,
        max_bs: int,
        max_pages_per_seq: int,
        hidden_size: int,
        dtype: torch.dtype,
        device: torch.device,
        capture: bool = True,
    ) -> None:
        """``capture=False`` runs each size's forward pass once and captures nothing (what
        ``compile_ahead`` records)."""
        self.sizes = capture_sizes(max_bs)
        self.max_bs = self.sizes[-1]
        n = self.max_bs

        def buf(*shape: int, dtype: torch.dtype = torch.int64, fill: int = 0) -> torch.Tensor:
            return torch.full(shape, fill, dtype=dtype, device=device)

        self.token_ids = buf(n)
        self.positions = buf(n)
        self.slot_mapping = buf(n, fill=-1)
        self.seq_lens = buf(n, dtype=torch.int32, fill=1)
        self.block_tables = buf(n, max_pages_per_seq, dtype=torch.int32)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.out = torch.empty(n, hidden_size, dtype=dtype, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        pool = torch.cuda.graph_pool_handle()
        for bs in reversed(self.sizes):
            ctx = ForwardContext(self._meta(bs, max_pages_per_seq), kv, backend)
            self._forward(model, bs, ctx)  # warm-up: compiles kernels, settles allocations
            if not capture:
                continue
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._forward(model, bs, ctx)
            self.graphs[bs] = graph
        torch.cuda.synchronize(device)
        if capture:
            log.info("captured decode CUDA graphs for batch sizes %s", self.sizes)

    def _meta(self, bs: int, max_pages: int) -> AttentionMetadata:
        return AttentionMetadata(
            query_start_loc=self.query_start_loc[: bs + 1],
            seq_lens=self.seq_lens[:bs],
            block_tables=self.block_tables[:bs],
            slot_mapping=self.slot_mapping[:bs],
            max_query_len=1,
            max_seq_len=max_pages,  # unused by the graph-safe decode kernel
            query_lens_cpu=[1] * bs,
            seq_lens_cpu=[1] * bs,
        )

    @torch.inference_mode()
    def _forward(self, model: torch.nn.Module, bs: int, ctx: ForwardContext) -> None:
        self.out[:bs] = model(self.token_ids[:bs], self.positions[:bs], ctx)

    def can_run(self, inputs: ModelInputs) -> bool:
        return inputs.meta.is_decode_only and inputs.meta.num_seqs <= self.max_bs

    def run(self, inputs: ModelInputs) -> torch.Tensor:
        """Hidden states [b, H] of a decode-only batch of ``b`` rows."""
        b = inputs.meta.num_seqs
        bs = next(s for s in self.sizes if s >= b)
        meta = inputs.meta
        width = meta.block_tables.shape[1]
        self.token_ids[:b].copy_(inputs.token_ids, non_blocking=True)
        self.positions[:b].copy_(inputs.positions, non_blocking=True)
        self.slot_mapping[:b].copy_(meta.slot_mapping, non_blocking=True)
        self.seq_lens[:b].copy_(meta.seq_lens, non_blocking=True)
        self.block_tables[:b, :width].copy_(meta.block_tables, non_blocking=True)
        if bs > b:
            self.slot_mapping[b:bs].fill_(-1)
            self.seq_lens[b:bs].fill_(0)
        self.graphs[bs].replay()
        return self.out[:b]
