"""Eager warm-up at start, so that no request pays a kernel compile.

Triton compiles a kernel once per set of constexprs and once per class of each int argument
it specializes (1, a multiple of 16, any other value). The decode CUDA graphs compile what
decode-only steps run; this runs one forward pass of each other kind of step a request can
cause (a prefill, decodes mixed with a prefill chunk, decodes alone in eager mode, with a split
and without, and, where the context allows it, a short chunk behind a long cached prefix,
whose attention splits its keys) at token counts of each class, then the LM head on their
rows. It writes nothing to the KV pool (every slot is -1) and reads only page 0.
"""

from __future__ import annotations

import logging
import time

import torch

from kvserve.engine.runner.kv_pool import KVPool
from kvserve.kernels.prefill_attention import SPLIT_MIN_CONTEXT
from kvserve.layers.attention import AttentionBackend, AttentionMetadata
from kvserve.models.forward_context import ForwardContext

log = logging.getLogger("kvserve.warmup")

# (decode rows, prefill rows, page-table width, the prefill's cached prefix): prefill alone at
# an odd and a 16-multiple token count; decodes before a prefill chunk; eager decodes with a
# short table (one split, written directly) and a wide one (split, then merged).
STEPS = [(0, 17, 4, 0), (0, 32, 4, 0), (1, 17, 4, 0), (3, 16, 4, 0), (16, 2, 4, 0), (3, 0, 2, 0),
         (3, 0, 256, 0)]  # fmt: skip
DECODE_CONTEXT = 20  # tokens each warm-up decode row attends to
LONG_CHUNK = 16  # rows of the chunk behind a long prefix


def step_shapes(context_length: int, page_size: int) -> list[tuple[int, int, int, int]]:
    """``STEPS``, plus a ``LONG_CHUNK``-row chunk ending at ``SPLIT_MIN_CONTEXT`` when the
    context reaches it (the shortest at which the prefill kernel splits keys)."""
    if context_length < SPLIT_MIN_CONTEXT:
        return list(STEPS)
    width = -(-SPLIT_MIN_CONTEXT // page_size)
    return [*STEPS, (0, LONG_CHUNK, width, SPLIT_MIN_CONTEXT - LONG_CHUNK)]


def step_meta(
    decodes: int, prefill: int, width: int, device: torch.device, prefix: int = 0
) -> AttentionMetadata:
    query_lens = [1] * decodes + ([prefill] if prefill else [])
    seq_lens = [DECODE_CONTEXT] * decodes + ([prefix + prefill] if prefill else [])
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)

    def ints(values: list[int], dtype: torch.dtype = torch.int32) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=device)

    return AttentionMetadata(
        query_start_loc=ints(starts),
        seq_lens=ints(seq_lens),
        block_tables=torch.zeros(len(seq_lens), width, dtype=torch.int32, device=device),
        slot_mapping=ints([-1] * starts[-1], torch.int64),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        query_lens_cpu=query_lens,
        seq_lens_cpu=seq_lens,
    )


@torch.inference_mode()
def warm_up_eager(
    model: torch.nn.Module,
    kv: KVPool,
    backend: AttentionBackend,
    device: torch.device,
    context_length: int,
) -> float:
    """Runs ``step_shapes``; returns the seconds it took."""
    t = time.perf_counter()
    shapes = step_shapes(context_length, kv.page_size)
    for decodes, prefill, width, prefix in shapes:
        meta = step_meta(decodes, prefill, width, device, prefix)
        positions = [DECODE_CONTEXT - 1] * decodes + list(range(prefix, prefix + prefill))
        pos = torch.tensor(positions, dtype=torch.int64, device=device)
        hidden = model(torch.zeros_like(pos), pos, ForwardContext(meta, kv, backend))
        model.compute_logits(hidden[: meta.num_seqs])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - t
    log.info("eager warm-up (%d step shapes) took %.1f s", len(shapes), elapsed)
    return elapsed
