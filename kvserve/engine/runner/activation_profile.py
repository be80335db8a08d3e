"""The activation memory of a largest step, measured with a forward pass over throw-away KV
pages before the real KV pool is sized."""

from __future__ import annotations

import torch

from kvserve.config import ModelConfig, SchedulerConfig
from kvserve.engine.runner.kv_pool import KVPool, PageGeometry
from kvserve.kv_layout import pages_for
from kvserve.layers.attention import AttentionBackend, AttentionMetadata
from kvserve.models.forward_context import ForwardContext


def activation_peak_bytes(
    model: torch.nn.Module,
    backend: AttentionBackend,
    model_config: ModelConfig,
    scheduler: SchedulerConfig,
    *,
    page_size: int,
    context_length: int,
    kv_dtype: torch.dtype,
    device: torch.device,
) -> int:
    """Bytes a largest step needs beyond the weights (CUDA only)."""
    tokens = scheduler.max_num_batched_tokens
    # One partly filled page per sequence at most: pages for the tokens + one per sequence.
    pages = pages_for(tokens, page_size) + pages_for(tokens, context_length)
    geometry = PageGeometry.of(model_config, pages, page_size)
    pool = KVPool.allocate(geometry, kv_dtype, device, one_tensor_for_all_layers=True)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    rows = min(tokens, scheduler.running_ceiling)
    _profile_step(model, ForwardContext(_prefill_meta(tokens, context_length, pool), pool, backend),
                  tokens, context_length, rows)  # fmt: skip
    peak = torch.cuda.max_memory_allocated(device) - base
    del pool
    torch.cuda.empty_cache()
    return peak


def _sequence_lengths(num_tokens: int, context_length: int) -> list[int]:
    """``num_tokens`` rows cut into sequences no longer than the context (positions beyond it
    would index past the rotary table)."""
    seq_len = min(num_tokens, context_length)
    tail = [num_tokens % seq_len] if num_tokens % seq_len else []
    return [seq_len] * (num_tokens // seq_len) + tail


def _prefill_meta(num_tokens: int, context_length: int, pool: KVPool) -> AttentionMetadata:
    dev, ps = pool.device, pool.page_size
    lens = _sequence_lengths(num_tokens, context_length)
    pages_per_seq = pool.pages_for(lens[0])
    starts = [0]
    for n in lens:
        starts.append(starts[-1] + n)
    tables = torch.arange(len(lens) * pages_per_seq, dtype=torch.int32, device=dev)
    return AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=dev),
        block_tables=tables.view(len(lens), pages_per_seq),
        slot_mapping=torch.cat(
            [i * pages_per_seq * ps + torch.arange(n, device=dev) for i, n in enumerate(lens)]
        ),
        max_query_len=lens[0],
        max_seq_len=lens[0],
        query_lens_cpu=lens,
        seq_lens_cpu=lens,
    )


@torch.inference_mode()
def _profile_step(
    model: torch.nn.Module, ctx: ForwardContext, num_tokens: int, context_length: int, rows: int
) -> None:
    """One prefill step of ``num_tokens`` rows, then the logits and softmax of ``rows``."""
    dev = ctx.kv.layer(0).device
    lens = _sequence_lengths(num_tokens, context_length)
    token_ids = torch.zeros(num_tokens, dtype=torch.int64, device=dev)
    positions = torch.cat([torch.arange(n, device=dev) for n in lens])
    hidden = model(token_ids, positions, ctx)
    model.compute_logits(hidden[:rows]).softmax(dim=-1)
    torch.cuda.synchronize(dev)
