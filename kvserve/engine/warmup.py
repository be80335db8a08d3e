"""A forward pass of a given size with throw-away KV pages: used to measure the activation
peak before the real KV cache is sized."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kvserve.layers.attention import AttentionMetadata
from kvserve.models.forward_context import ForwardContext

if TYPE_CHECKING:
    from kvserve.engine.model_runner import ModelRunner


@torch.inference_mode()
def profile_step(runner: ModelRunner, caches: list[torch.Tensor], num_tokens: int) -> None:
    dev, ps = runner.device, runner.page_size
    pages = -(-num_tokens // ps)
    meta = AttentionMetadata(
        query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int32, device=dev),
        seq_lens=torch.tensor([num_tokens], dtype=torch.int32, device=dev),
        block_tables=torch.arange(pages, dtype=torch.int32, device=dev)[None, :],
        slot_mapping=torch.arange(num_tokens, dtype=torch.int64, device=dev),
        max_query_len=num_tokens,
        max_seq_len=num_tokens,
        query_lens_cpu=[num_tokens],
        seq_lens_cpu=[num_tokens],
    )
    token_ids = torch.zeros(num_tokens, dtype=torch.int64, device=dev)
    positions = torch.arange(num_tokens, dtype=torch.int64, device=dev)
    hidden = runner.model(token_ids, positions, ForwardContext(meta, caches, runner.backend))
    rows = min(num_tokens, runner.config.scheduler.max_running_requests)
    runner.model.compute_logits(hidden[:rows]).softmax(dim=-1)
    torch.cuda.synchronize(dev)
