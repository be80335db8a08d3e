"""Prefill attention through cuDNN's fused SDPA (``nvidia-cudnn-frontend``), reading the paged
KV cache in place: ragged query rows, one page table per sequence, causal masking aligned to
the bottom right (row j of a chunk sees its sequence's cached prefix and the chunk up to j).

On the H200 it ran at 1.28-1.62x the speed of the Triton kernel (``paged_prefill_attention``),
at 4K-128K tokens, on whole prompts and on 2K / 16K chunks behind long prefixes alike: 464-551
against 286-427 TFLOP/s (``python -m benchmarks.attention_libraries``,
attention_libraries_2026-12-02.json). The Triton backend hands it a step's prefill rows when the
library imports, the GPU is sm_90 (where it was measured), the cache holds the model's 16-bit
dtype, and the step's attention is large enough (``MIN_PAIRS``) for the library's host work (a
variant pack per call, a graph built once per shape) not to matter; every other step stays on
the Triton kernel.

cuDNN builds a graph for fixed dimensions: the batch, the longest chunk, the page table's
width, the pool. A graph built for longer chunks or a wider table than a step's serves it at
no cost: a sequence's rows past its own length and table entries past its pages are never read,
and on the H200 a 2K-row step ran as fast (within 1%) through a graph for 16K rows or a
128K-token table as through its own; padded sequences (of length 0) did cost small steps, +3%
for 64 and +14% for 256 (``python -m benchmarks.attention_libraries --parts buckets``). So the
engine fixes the longest chunk and the widest table it can schedule (``GraphDims``, given at
construction), rounds only the batch up to a power of two, and builds and runs each batch's
graph at start (``warm_batches``); standalone, every dimension rounds up to a power of two.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from kvserve.config import SchedulerConfig
from kvserve.kernels._triton import next_pow2
from kvserve.layers.attention.metadata import AttentionMetadata

log = logging.getLogger(__name__)

# Query-key pairs a step's prefill rows attend (sum of new rows x sequence length) from which
# they go to cuDNN: 2K rows at 2K context. Below it a step's attention takes tens of
# microseconds a layer, comparable to the library's host work per call.
MIN_PAIRS = 1 << 22
_MIN_QUERY_BUCKET = 64
_MIN_CUDNN_VERSION = 90500  # paged K/V caches in the SDPA graph
MISSING_PACKAGE = "nvidia-cudnn-frontend is not installed (pip install nvidia-cudnn-frontend)"


def cudnn_prefill_unavailable(
    device: torch.device, dtype: torch.dtype, kv_dtype: torch.dtype, head_dim: int
) -> str | None:
    """Why cuDNN cannot take prefill attention here, or None when it can."""
    if device.type != "cuda":
        return "it needs a CUDA device"
    if torch.cuda.get_device_capability(device) != (9, 0):
        return "it is enabled on sm_90 (Hopper) only, where it was measured"
    if dtype not in (torch.bfloat16, torch.float16) or kv_dtype != dtype:
        return f"it needs a bf16 or fp16 model with a cache of the same dtype ({dtype}, {kv_dtype})"
    if head_dim not in (64, 128):
        return f"head_dim {head_dim} was not tried with it (64 and 128 were)"
    try:
        import cudnn

        version = cudnn.backend_version()
    except ImportError:
        return MISSING_PACKAGE
    except Exception as exc:  # noqa: BLE001 - a broken install must not stop an auto start
        return f"nvidia-cudnn-frontend does not load ({type(exc).__name__}: {exc})"[:300]
    if version < _MIN_CUDNN_VERSION:
        return f"cuDNN {version} is older than 9.5 (no paged caches)"
    return None


@dataclass(frozen=True)
class _Shape:
    """What a built graph fixes."""

    batch: int  # bucketed
    max_query: int  # bucketed
    table_width: int  # bucketed
    num_pages: int
    page_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    q_token_stride: int
    dtype: torch.dtype
    scale: float


@dataclass(frozen=True)
class GraphDims:
    """What the engine can schedule: its longest prefill chunk, widest page table (both
    powers of two; 0: each step's own, rounded up) and most prefill chunks in a step."""

    max_query: int
    table_width: int
    max_batch: int

    @classmethod
    def for_engine(cls, scheduler: SchedulerConfig, max_pages_per_seq: int) -> GraphDims:
        max_query = max(_MIN_QUERY_BUCKET, next_pow2(scheduler.longest_chunk))
        return cls(max_query, next_pow2(max_pages_per_seq), next_pow2(scheduler.most_chunks))


STANDALONE = GraphDims(0, 0, 0)  # every dimension of a step rounded up to a power of two


def _pow2_up_to(n: int) -> list[int]:
    return [1 << i for i in range(n.bit_length()) if 1 << i <= n]


@dataclass
class _StepInputs:
    """A step's per-sequence tensors, padded to the bucketed batch; built once for all layers."""

    shape_batch: int
    max_query: int
    seq_q: torch.Tensor  # int32 [Bb, 1, 1, 1]
    seq_kv: torch.Tensor  # int32 [Bb, 1, 1, 1]
    q_start: torch.Tensor  # int32 [Bb + 1, 1, 1, 1]: first row of each sequence, in tokens
    table: torch.Tensor  # int32 [Bb, 1, W, 1], W a power of two
    _offsets: dict[int, torch.Tensor] | None = None

    def offsets(self, token_stride: int) -> torch.Tensor:
        """Ragged offsets in elements: each sequence's first row times ``token_stride`` (int32:
        a step's rows times a token's stride stay far below 2^31)."""
        self._offsets = self._offsets or {}
        if token_stride not in self._offsets:
            self._offsets[token_stride] = self.q_start * token_stride
        return self._offsets[token_stride]


class _Graph:
    def __init__(self, shape: _Shape, handle: object, device: torch.device) -> None:
        import cudnn

        s = shape
        io = cudnn.data_type.BFLOAT16 if s.dtype == torch.bfloat16 else cudnn.data_type.HALF
        i32 = cudnn.data_type.INT32
        graph = cudnn.pygraph(
            io_data_type=io,
            intermediate_data_type=cudnn.data_type.FLOAT,
            compute_data_type=cudnn.data_type.FLOAT,
            handle=handle,
        )
        per_seq = [s.batch, 1, 1, 1]
        self.q_offset = graph.tensor(dim=[s.batch + 1, 1, 1, 1], stride=[1] * 4, data_type=i32)
        self.o_offset = graph.tensor(dim=[s.batch + 1, 1, 1, 1], stride=[1] * 4, data_type=i32)
        self.seq_q = graph.tensor(dim=per_seq, stride=[1] * 4, data_type=i32)
        self.seq_kv = graph.tensor(dim=per_seq, stride=[1] * 4, data_type=i32)
        width = s.table_width
        self.table = graph.tensor(dim=[s.batch, 1, width, 1], stride=[width, width, 1, 1],
                                  data_type=i32)  # fmt: skip
        # q and out token-major [T, H, D]; the cache [pages, page, Hkv, D] read as
        # [pages, Hkv, page, D]
        self.q = graph.tensor(
            dim=[s.batch, s.num_heads, s.max_query, s.head_dim],
            stride=[s.max_query * s.q_token_stride, s.head_dim, s.q_token_stride, 1],
            data_type=io, ragged_offset=self.q_offset,
        )  # fmt: skip
        token = s.num_kv_heads * s.head_dim
        cache_dim = [s.num_pages, s.num_kv_heads, s.page_size, s.head_dim]
        cache_stride = [s.page_size * token, s.head_dim, token, 1]
        self.k = graph.tensor(dim=cache_dim, stride=cache_stride, data_type=io)
        self.v = graph.tensor(dim=cache_dim, stride=cache_stride, data_type=io)
        o, _ = graph.sdpa(
            name="prefill", q=self.q, k=self.k, v=self.v, is_inference=True,
            attn_scale=s.scale, use_causal_mask_bottom_right=True, use_padding_mask=True,
            seq_len_q=self.seq_q, seq_len_kv=self.seq_kv, paged_attention_k_table=self.table,
            paged_attention_v_table=self.table,
            paged_attention_max_seq_len_kv=width * s.page_size,
        )  # fmt: skip
        out_token = s.num_heads * s.head_dim
        o.set_output(True).set_dim([s.batch, s.num_heads, s.max_query, s.head_dim])
        o.set_stride([s.max_query * out_token, s.head_dim, out_token, 1])
        o.set_ragged_offset(self.o_offset)
        self.o = o
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.check_support()
        graph.build_plans()
        self.graph = graph
        self.workspace = torch.empty(graph.get_workspace_size(), dtype=torch.uint8, device=device)


class CudnnPrefill:
    """Prefill attention of a step's chunks through cuDNN; graphs cached by shape."""

    def __init__(self, device: torch.device, dims: GraphDims = STANDALONE) -> None:
        """``dims``: the engine's (graphs then differ by batch alone), or ``STANDALONE``."""
        import cudnn

        self._cudnn, self.device = cudnn, device
        with torch.cuda.device(device):  # a tensor-parallel rank's own GPU, not the current one
            self._handle = cudnn.create_handle()
        self._graphs: dict[_Shape, _Graph] = {}
        self.builds: list[dict[str, float]] = []  # each graph built: its buckets and seconds
        self._step: tuple[AttentionMetadata, int, _StepInputs | None] | None = None
        self.dims = dims
        self._last: _Shape | None = None  # the shape of the latest call

    def warm_batches(self, kv_cache: torch.Tensor, meta: AttentionMetadata) -> None:
        """Builds and runs once the graph of every batch bucket up to ``dims.max_batch``, on
        ``meta``'s step (the latest call's, on ``kv_cache``'s pool) padded with empty sequences:
        a graph's first run costs too, not only its build."""
        assert self.dims.max_batch and self._last is not None, "engine dims, then a step"
        last, dims = self._last, self.dims
        rows = sum(meta.query_lens_cpu)
        rows_buffer = torch.zeros(rows * last.q_token_stride, dtype=last.dtype, device=self.device)
        q = rows_buffer.as_strided(
            (rows, last.num_heads, last.head_dim), (last.q_token_stride, last.head_dim, 1)
        )  # the latest call's q: a view of the engine's fused rows
        for batch in _pow2_up_to(dims.max_batch):
            if batch >= meta.num_seqs:
                inputs = pad_step_inputs(meta, 0, batch, dims.max_query, dims.table_width)
                self(q, kv_cache, inputs, last.scale)

    def step_inputs(self, meta: AttentionMetadata, first_seq: int) -> _StepInputs | None:
        """This step's padded inputs for sequences ``first_seq:`` (the prefill chunks), or
        None when their attention is below ``MIN_PAIRS``. Cached for the step's layers."""
        if self._step is not None and self._step[0] is meta and self._step[1] == first_seq:
            return self._step[2]
        qlens, slens = meta.query_lens_cpu[first_seq:], meta.seq_lens_cpu[first_seq:]
        pairs = sum(q * s for q, s in zip(qlens, slens, strict=True))
        inputs = None
        if pairs >= MIN_PAIRS:
            inputs = pad_step_inputs(meta, first_seq, next_pow2(len(qlens)),
                                     self.dims.max_query, self.dims.table_width)  # fmt: skip
        self._step = (meta, first_seq, inputs)
        return inputs

    def __call__(
        self,
        q: torch.Tensor,  # [T, Hq, D]: the chunks' rows, in sequence order
        kv_cache: torch.Tensor,  # [2, num_pages, page_size, Hkv, D]
        inputs: _StepInputs,
        scale: float,
    ) -> torch.Tensor:  # [T, Hq, D]
        if q.stride(2) != 1 or q.stride(1) != q.shape[2]:
            q = q.contiguous()
        _, num_pages, page_size, num_kv_heads, head_dim = kv_cache.shape
        shape = _Shape(
            inputs.shape_batch, inputs.max_query, inputs.table.shape[2], num_pages, page_size,
            q.shape[1], num_kv_heads, head_dim, q.stride(0), q.dtype, scale,
        )  # fmt: skip
        graph = self._graphs.get(shape) or self._build(shape)
        self._last = shape
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        self._cudnn.set_stream(self._handle, torch.cuda.current_stream(q.device).cuda_stream)
        g = graph
        # Bare addresses: the graph's declarations say what the bytes are (the torch views'
        # own shapes differ: [T, Hq, D] for the bucketed [Bb, Hq, S, D], say)
        pack = {
            g.q: q, g.k: kv_cache[0], g.v: kv_cache[1], g.o: out, g.seq_q: inputs.seq_q,
            g.seq_kv: inputs.seq_kv, g.table: inputs.table,
            g.q_offset: inputs.offsets(q.stride(0)), g.o_offset: inputs.offsets(out.stride(0)),
        }  # fmt: skip
        pack = {key: tensor.data_ptr() for key, tensor in pack.items()}
        g.graph.execute(pack, g.workspace, handle=self._handle)
        return out

    def plan_names(self) -> list[str]:
        """The execution plans cuDNN's heuristics ranked for the latest call's graph (the
        first is the one its build takes)."""
        graph = self._graphs[self._last].graph
        return [graph.get_plan_name_at_index(i) for i in range(graph.get_execution_plan_count())]

    def use_plan(self, index: int) -> None:
        """Builds plan ``index`` of the latest call's graph and runs it from then on (the
        benchmarks time each; the engine keeps the first)."""
        g = self._graphs[self._last]
        g.graph.build_plan_at_index(index)
        g.workspace = torch.empty(
            g.graph.get_workspace_size(), dtype=torch.uint8, device=self.device
        )

    def _build(self, shape: _Shape) -> _Graph:
        start = time.perf_counter()
        with torch.cuda.device(self.device):
            graph = self._graphs[shape] = _Graph(shape, self._handle, self.device)
        seconds = time.perf_counter() - start
        self.builds.append({"batch": shape.batch, "max_query": shape.max_query,
                            "table_width": shape.table_width, "seconds": seconds})  # fmt: skip
        log.info(
            "cuDNN prefill graph for %d sequences x %d rows (table width %d) built in %.2f s",
            shape.batch, shape.max_query, shape.table_width, seconds,
        )  # fmt: skip
        return graph


def pad_step_inputs(
    meta: AttentionMetadata,
    first_seq: int,
    batch: int,
    max_query: int = 0,
    width: int = 0,
) -> _StepInputs:
    """Sequences ``first_seq:`` of a step padded to ``batch`` sequences, a graph's longest chunk
    ``max_query`` and a page table ``width`` columns wide (0, or where the step needs more: the
    step's own, rounded up to powers of two)."""
    qsl = meta.query_start_loc[first_seq:]
    qsl = qsl - qsl[0]  # rows of the chunks start at 0 in the q handed to cuDNN
    n = qsl.shape[0] - 1
    device = qsl.device
    seq_q = torch.zeros(batch, 1, 1, 1, dtype=torch.int32, device=device)
    seq_q[:n, 0, 0, 0] = qsl[1:] - qsl[:-1]
    seq_kv = torch.zeros_like(seq_q)
    seq_kv[:n, 0, 0, 0] = meta.seq_lens[first_seq:]
    q_start = torch.empty(batch + 1, 1, 1, 1, dtype=torch.int32, device=device)
    q_start[: n + 1, 0, 0, 0] = qsl
    q_start[n + 1 :] = qsl[-1]  # padded sequences: empty, at the end
    tables = meta.block_tables[first_seq:]
    # The engine's tables are as wide as the step's longest sequence: padded to a power of two
    # (zeros, as the tail of a table), so that a long prompt's chunks do not build a graph each
    width = max(width, next_pow2(tables.shape[1]))
    table = torch.zeros(batch, 1, width, 1, dtype=torch.int32, device=device)
    table[:n, 0, : tables.shape[1], 0] = tables
    longest = max(meta.query_lens_cpu[first_seq:])
    max_query = max(max_query, _MIN_QUERY_BUCKET, next_pow2(longest))
    return _StepInputs(batch, max_query, seq_q, seq_kv, q_start, table)
