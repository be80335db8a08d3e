"""Eager warm-up at start, so that no request pays a kernel compile.

Triton compiles a kernel once per set of constexprs and once per class of each int argument
it specializes (1, a multiple of 16, any other value). The decode CUDA graphs compile what
decode-only steps run; this runs one forward pass of each other kind of step a request can
cause (a prefill, decodes mixed with a prefill chunk, decodes alone in eager mode, with a split
and without, and, where the context allows it, a short chunk behind a long cached prefix,
whose attention splits its keys) at token counts of each class, then the LM head on their
rows. Decode attention's launches vary with the batch and the page table's width (split
count, balanced cut, batch block: ``decode_attention.launch_variant``), so a decode step runs
for each variant that some number of decode rows up to the scheduler's most can reach and
the steps above do not. It writes nothing to the KV pool (every slot is -1) and reads only
page 0.
"""

from __future__ import annotations

import logging
import time

import torch

from kvserve.config import SchedulerConfig
from kvserve.engine.runner.kv_pool import KVPool
from kvserve.kernels._triton import sm_count
from kvserve.kernels.decode_attention import (
    SPLIT_COUNT_TABLE_TOKENS,
    DecodeConfig,
    default_decode_config,
    launch_variant,
)
from kvserve.kernels.prefill_attention import SPLIT_MIN_CONTEXT
from kvserve.layers.attention import AttentionBackend, AttentionMetadata, cudnn_prefill
from kvserve.layers.attention.cudnn_prefill import CudnnPrefill
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


def decode_steps(
    cfg: DecodeConfig,
    num_kv_heads: int,
    sms: int,
    page_size: int,
    max_pages: int,
    max_decodes: int,
    have: list[tuple[int, int, int, int]],
) -> list[tuple[int, int, int, int]]:
    """A decode-only step (decode rows, 0, page-table width, 0) for each decode attention
    variant that 1 to ``max_decodes`` decode rows over tables of 1 to ``max_pages`` pages
    launch and the steps in ``have`` do not. The split count takes a new value only at the
    first width of each 64 tokens up to SPLIT_COUNT_TABLE_TOKENS, so those widths are all
    that need trying."""

    def variant(decodes: int, width: int) -> tuple:
        return launch_variant(cfg, decodes, num_kv_heads, width * page_size, sms)

    tiles = range(SPLIT_COUNT_TABLE_TOKENS // 64 + 1)
    widths = sorted({min(max_pages, 64 * t // page_size + 1) for t in tiles} | {max_pages})
    seen = {variant(d, w) for d, _, w, _ in have if d}
    steps = []
    for decodes in range(1, max_decodes + 1):
        for width in widths:
            key = variant(decodes, width)
            if key not in seen:
                seen.add(key)
                steps.append((decodes, 0, width, 0))
    return steps


def step_meta(
    decodes: int,
    prefill: int,
    width: int,
    device: torch.device,
    prefix: int = 0,
    prefills: int = 1,
) -> AttentionMetadata:
    """``decodes`` rows, then ``prefills`` chunks of ``prefill`` rows behind ``prefix`` cached
    tokens each."""
    prefills = prefills if prefill else 0
    query_lens = [1] * decodes + [prefill] * prefills
    seq_lens = [DECODE_CONTEXT] * decodes + [prefix + prefill] * prefills
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
    max_decodes: int = 16,
) -> float:
    """Runs ``step_shapes`` and the ``decode_steps`` of up to ``max_decodes`` decode rows;
    returns the seconds it took."""
    t = time.perf_counter()
    shapes = step_shapes(context_length, kv.page_size)
    cache = kv.layer(0)
    shapes += decode_steps(
        default_decode_config(cache), cache.shape[3], sm_count(device), kv.page_size,
        kv.pages_for(context_length), max_decodes, shapes,
    )  # fmt: skip
    for decodes, prefill, width, prefix in shapes:
        _forward(model, kv, backend, step_meta(decodes, prefill, width, device, prefix))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - t
    log.info("eager warm-up (%d step shapes) took %.1f s", len(shapes), elapsed)
    return elapsed


def _forward(
    model: torch.nn.Module, kv: KVPool, backend: AttentionBackend, meta: AttentionMetadata
) -> None:
    """One step over ``meta``'s rows (token 0 at each row's position), then the LM head."""
    positions = []
    for q, s in zip(meta.query_lens_cpu, meta.seq_lens_cpu, strict=True):
        positions += range(s - q, s)
    pos = torch.tensor(positions, dtype=torch.int64, device=meta.seq_lens.device)
    hidden = model(torch.zeros_like(pos), pos, ForwardContext(meta, kv, backend))
    model.compute_logits(hidden[: meta.num_seqs])


def library_step(
    max_chunk: int, budget: int, context_length: int, max_chunks: int, min_pairs: int
) -> tuple[int, int, int] | None:
    """(chunks, rows each, cached prefix each) of a step whose attention reaches ``min_pairs``
    query-key pairs within what the engine schedules: chunks of at most ``max_chunk`` rows,
    ``budget`` rows in all, ``max_chunks`` of them, sequences of at most ``context_length``.
    None when no step reaches it: the prefill library is never called."""
    rows = min(max_chunk, budget, context_length)
    prefix = min(context_length - rows, max(0, -(-min_pairs // rows) - rows))
    chunks = max(1, -(-min_pairs // (rows * (prefix + rows))))
    if chunks > max_chunks or chunks * rows > budget:
        return None
    return chunks, rows, prefix


@torch.inference_mode()
def warm_up_prefill_library(
    model: torch.nn.Module,
    kv: KVPool,
    backend: AttentionBackend,
    library: CudnnPrefill,
    context_length: int,
    scheduler: SchedulerConfig,
) -> float:
    """Runs one step on the engine's pool large enough for ``library`` (building that step's
    graph), then has it build and run the graph of every other batch ``scheduler`` can send
    it; returns the seconds it took."""
    t = time.perf_counter()
    built = len(library.builds)
    meta = library_step_meta(kv, context_length, scheduler)
    if meta is None:
        log.info("prefill library: no step this engine schedules is large enough for it")
        return 0.0
    _forward(model, kv, backend, meta)
    library.warm_batches(kv.layer(0), meta)
    torch.cuda.synchronize(kv.device)
    elapsed = time.perf_counter() - t
    log.info("prefill library: %d cuDNN graphs built at start in %.1f s",
             len(library.builds) - built, elapsed)  # fmt: skip
    return elapsed


def library_step_meta(
    kv: KVPool, context_length: int, scheduler: SchedulerConfig
) -> AttentionMetadata | None:
    """The metadata of ``library_step`` on ``kv``'s pages, or None when there is none."""
    step = library_step(
        scheduler.longest_chunk, scheduler.max_num_batched_tokens, context_length,
        scheduler.most_chunks, cudnn_prefill.MIN_PAIRS,
    )  # fmt: skip
    if step is None:
        return None
    chunks, rows, prefix = step
    return step_meta(0, rows, kv.geometry.pages_for(prefix + rows), kv.device, prefix, chunks)


@torch.inference_mode()
def run_library_step(
    model: torch.nn.Module,
    kv: KVPool,
    backend: AttentionBackend,
    context_length: int,
    scheduler: SchedulerConfig,
) -> None:
    """The forward pass of ``library_step`` alone (no other batch's graph)."""
    meta = library_step_meta(kv, context_length, scheduler)
    if meta is not None:
        _forward(model, kv, backend, meta)
