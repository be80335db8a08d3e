"""A forward pass of a given size with throw-away KV pages: used to measure the activation
peak before the real KV cache is sized."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kvserve.layers.attention import AttentionMetadata
from kvserve.models.forward_context import ForwardContext

if TYPE_CHECKING:
    from kvserve.engine.runner.model_runner import ModelRunner


@torch.inference_mode()
def profile_step(
    runner: ModelRunner, caches: list[torch.Tensor], num_tokens: int, context_length: int
) -> None:
    """One prefill step of ``num_tokens`` rows, cut into sequences no longer than the context
    (positions beyond it would index past the rotary table)."""
    dev, ps = runner.device, runner.page_size
    seq_len = min(num_tokens, context_length)
    lens = [seq_len] * (num_tokens // seq_len) + (
        [num_tokens % seq_len] if num_tokens % seq_len else []
    )
    pages_per_seq = -(-seq_len // ps)
    starts = [0]
    for n in lens:
        starts.append(starts[-1] + n)
    tables = torch.arange(len(lens) * pages_per_seq, dtype=torch.int32, device=dev)
    meta = AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=dev),
        block_tables=tables.view(len(lens), pages_per_seq),
        slot_mapping=torch.cat(
            [i * pages_per_seq * ps + torch.arange(n, device=dev) for i, n in enumerate(lens)]
        ),
        max_query_len=seq_len,
        max_seq_len=seq_len,
        query_lens_cpu=lens,
        seq_lens_cpu=lens,
    )
    token_ids = torch.zeros(num_tokens, dtype=torch.int64, device=dev)
    positions = torch.cat([torch.arange(n, device=dev) for n in lens])
    hidden = runner.model(token_ids, positions, ForwardContext(meta, caches, runner.backend))
    rows = min(num_tokens, runner.config.scheduler.max_running_requests)
    runner.model.compute_logits(hidden[:rows]).softmax(dim=-1)
    torch.cuda.synchronize(dev)
