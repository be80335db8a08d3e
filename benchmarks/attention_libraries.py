"""Prefill attention at long context: kvserve's paged Triton kernel against the attention
libraries a Hopper node already has or can carry as a wheel, on the shapes a long prompt's
prefill launches (a whole prompt; a chunk of new rows behind a cached prefix).

- ``triton``: ``paged_prefill_attention``, pages in random order (as the engine's pool).
- ``sdpa_flash`` / ``sdpa_cudnn``: torch's SDPA on contiguous [1, H, L, D] keys (bottom-right
  causal for a chunk, GQA by ``enable_gqa``); ``gather_ms`` is what copying a sequence's pages
  into such a buffer costs.
- ``cudnn_paged``: cuDNN's SDPA through ``nvidia-cudnn-frontend`` reading the paged cache in
  place (page table, bottom-right causal), as the engine calls it
  (``kvserve.layers.attention.cudnn_prefill``); its output is checked against the Triton
  kernel's.

``--parts flashinfer``: FlashInfer's paged prefill (``flashinfer-python``, its FA3 and FA2
backends, JIT-compiled with the node's nvcc on first use) against the engine's cuDNN call on the
same cache, pages and step; its output is checked against cuDNN's. Not a dependency of kvserve:
carry the wheel and ``apache-tvm-ffi`` to the node to run it.

``--parts plans``: every execution plan cuDNN's heuristics rank for the engine's graph, each
built and timed on the step (the engine takes the first).

``--parts buckets``: cuDNN's speed on a step through a graph built for more than the step
(a page table as wide as a 128K context, a longer chunk, a larger batch of empty sequences):
what one graph serving many steps would cost them. ``--parts pages``: its speed at page sizes
16-128.

Causal FLOPs (4 per query-key pair and dim) against a bf16 matmul measured in the same run.
Llama-3-8B heads (32 q, 8 kv, D = 128), bf16, page 16.

    python -m benchmarks.attention_libraries [--parts libraries,flashinfer,plans,buckets,pages]
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from benchmarks.common import matmul_tflops, median_ms, write_result
from benchmarks.kernels_h200 import DTYPE, HEAD_DIM, HKV, HQ, PAGE, SCALE, prefill_inputs
from benchmarks.long_context_sweep import attention_flops
from kvserve.kernels.prefill_attention import paged_prefill_attention

if TYPE_CHECKING:
    from kvserve.layers.attention.cudnn_prefill import CudnnPrefill

# (new rows, sequence length)
SHAPES = [(4096, 4096), (16384, 16384), (32768, 32768), (2048, 32768), (16384, 32768),
          (2048, 131072), (16384, 131072)]  # fmt: skip


def sdpa_ms(backend: str, qlen: int, seq_len: int) -> float:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    q = torch.randn(1, HQ, qlen, HEAD_DIM, dtype=DTYPE, device="cuda")
    k = torch.randn(1, HKV, seq_len, HEAD_DIM, dtype=DTYPE, device="cuda")
    v = torch.randn_like(k)
    chosen = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}
    mask = None if qlen == seq_len else causal_lower_right(qlen, seq_len)

    def call() -> torch.Tensor:
        with sdpa_kernel(chosen[backend]):
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, is_causal=mask is None, scale=SCALE, enable_gqa=True
            )

    return median_ms(call)


def gather_ms(seq_len: int) -> float:
    """Copying one sequence's K and V pages into contiguous [Hkv, L, D] buffers."""
    _, kv_cache, _, _, tables = prefill_inputs(seq_len, 1)
    pages = tables[0].long()
    return median_ms(lambda: kv_cache[:, pages].permute(0, 3, 1, 2, 4).contiguous())


def cudnn_paged_call(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    qsl: torch.Tensor,
    seq_lens: torch.Tensor,
    tables: torch.Tensor,
    buckets: dict[str, int] | None = None,
    library: CudnnPrefill | None = None,
) -> Callable[[], torch.Tensor]:
    """The engine's cuDNN prefill (``CudnnPrefill``, or ``library``) on one sequence's step.
    ``buckets``: the graph's batch / max_query / width (its page table's columns) when not the
    engine's own rounding of this step (padded sequences are empty; padded table columns are
    zeros)."""
    from kvserve.layers.attention.cudnn_prefill import CudnnPrefill, pad_step_inputs
    from kvserve.layers.attention.metadata import AttentionMetadata

    qlen, seq_len = q.shape[0], tables.shape[1] * kv_cache.shape[2]
    meta = AttentionMetadata(
        query_start_loc=qsl, seq_lens=seq_lens, block_tables=tables,
        slot_mapping=torch.empty(0, dtype=torch.int64, device=q.device), max_query_len=qlen,
        max_seq_len=seq_len, query_lens_cpu=[qlen], seq_lens_cpu=[seq_len],
    )  # fmt: skip
    library = library or CudnnPrefill(q.device)
    inputs = library.step_inputs(meta, 0)
    assert inputs is not None, "below the size the engine hands to cuDNN"
    if buckets:
        inputs = pad_step_inputs(meta, 0, **{"batch": inputs.shape_batch, **buckets})
    return lambda: library(q, kv_cache, inputs, SCALE)


def library_rows(qlen: int, seq_len: int, mm_tflops: float) -> list[dict]:
    flops = attention_flops(qlen, seq_len)
    q, kv_cache, qsl, seq_lens, tables = prefill_inputs(seq_len, qlen)

    def triton() -> torch.Tensor:
        return paged_prefill_attention(q, kv_cache, qsl, seq_lens, tables, qlen, SCALE)

    runs: dict[str, Callable[[], float]] = {
        "triton": lambda: median_ms(triton),
        "sdpa_flash": lambda: sdpa_ms("sdpa_flash", qlen, seq_len),
        "sdpa_cudnn": lambda: sdpa_ms("sdpa_cudnn", qlen, seq_len),
    }
    rows = []
    for name, run in runs.items():
        rows.append(timed_row(name, run, flops, mm_tflops))
    try:
        cudnn_call = cudnn_paged_call(q, kv_cache, qsl, seq_lens, tables)
        err = (cudnn_call().float() - triton().float()).abs().max().item()
        row = timed_row("cudnn_paged", lambda: median_ms(cudnn_call), flops, mm_tflops)
        row["max_abs_diff_vs_triton"] = err
    except Exception as exc:  # noqa: BLE001 - a library that cannot run a shape is a result
        row = {"library": "cudnn_paged", "error": f"{type(exc).__name__}: {exc}"[:400]}
    rows.append(row)
    for row in rows:
        row.update(qlen=qlen, seq_len=seq_len)
        print_row(row, f"{row['library']:12s}")
    return rows


# (new rows, sequence length) and graph buckets padded past the step's own: whether one graph
# for many steps (a page table as wide as the engine's longest context, the longest chunk the
# scheduler makes, a batch of empty sequences) costs the steps it serves anything
# (the engine's graphs: its longest chunk, widest table, batch up to its most running requests;
# (64, 65536) is about the smallest step the engine hands cuDNN, in the largest graph)
BUCKET_SHAPES = [(64, 65536), (2048, 4096), (2048, 32768), (8192, 32768), (2048, 131072)]
ENGINE_GRAPH = {"width": 131072 // PAGE, "max_query": 8192}
BUCKET_PADDINGS = [{}, {"width": 131072 // PAGE}, {"max_query": 8192}, {"max_query": 16384},
                   {"batch": 8}, {"batch": 64}, {**ENGINE_GRAPH, "batch": 8},
                   {**ENGINE_GRAPH, "batch": 256}]  # fmt: skip


def bucket_rows(mm_tflops: float) -> list[dict]:
    rows = []
    for qlen, seq_len in BUCKET_SHAPES:
        q, kv_cache, qsl, seq_lens, tables = prefill_inputs(seq_len, qlen)
        for padding in BUCKET_PADDINGS:
            call = cudnn_paged_call(q, kv_cache, qsl, seq_lens, tables, padding)
            run = functools.partial(median_ms, call)
            row = timed_row("cudnn_paged", run, attention_flops(qlen, seq_len), mm_tflops)
            rows.append({**row, "qlen": qlen, "seq_len": seq_len, "padded": padding})
            print_row(rows[-1], f"padded {padding}:")
    return rows


# (new rows, sequence length) at each page size: cuDNN gathers keys a page at a time
PAGE_SHAPES = [(32768, 32768), (2048, 32768), (16384, 131072)]
PAGE_SIZES = [16, 32, 64, 128]


def page_rows(mm_tflops: float) -> list[dict]:
    rows = []
    for qlen, seq_len in PAGE_SHAPES:
        for page in PAGE_SIZES:
            q, kv_cache, qsl, seq_lens, tables = prefill_inputs(seq_len, qlen, page)
            call = cudnn_paged_call(q, kv_cache, qsl, seq_lens, tables)
            run = functools.partial(median_ms, call)
            row = timed_row("cudnn_paged", run, attention_flops(qlen, seq_len), mm_tflops)
            rows.append({**row, "qlen": qlen, "seq_len": seq_len, "page": page})
            print_row(rows[-1], f"page {page:3d}:")
            del q, kv_cache
    return rows


# (new rows, sequence length): the whole prompts and the chunks the 32 x 32K and 128K runs make
FLASHINFER_SHAPES = [(4096, 4096), (32768, 32768), (2048, 32768), (8192, 32768),
                     (2048, 131072), (16384, 131072)]  # fmt: skip
FLASHINFER_BACKENDS = ("fa3", "fa2")


def flashinfer_call(
    backend: str, q: torch.Tensor, kv_cache: torch.Tensor, tables: torch.Tensor, seq_len: int
) -> Callable[[], torch.Tensor]:
    """FlashInfer's paged prefill of one sequence's step over the same cache (K and V pages
    [pages, page, Hkv, D] each: its NHD layout) and page table; causal is bottom-right."""
    import flashinfer

    workspace = torch.empty(256 << 20, dtype=torch.uint8, device=q.device)
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend=backend)
    pages, page = -(-seq_len // kv_cache.shape[2]), kv_cache.shape[2]

    def i32(*values: int) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=q.device)

    wrapper.plan(
        i32(0, q.shape[0]), i32(0, pages), tables[0, :pages].contiguous(),
        i32(seq_len - (pages - 1) * page), HQ, HKV, HEAD_DIM, page, causal=True, sm_scale=SCALE,
        q_data_type=q.dtype, kv_data_type=kv_cache.dtype,
    )  # fmt: skip
    return lambda: wrapper.run(q, (kv_cache[0], kv_cache[1]))


def flashinfer_rows(mm_tflops: float) -> list[dict]:
    rows = []
    for qlen, seq_len in FLASHINFER_SHAPES:
        q, kv_cache, qsl, seq_lens, tables = prefill_inputs(seq_len, qlen)
        flops = attention_flops(qlen, seq_len)
        cudnn_call = cudnn_paged_call(q, kv_cache, qsl, seq_lens, tables)
        reference = cudnn_call().float()
        found = [
            timed_row("cudnn_paged", functools.partial(median_ms, cudnn_call), flops, mm_tflops)
        ]
        for backend in FLASHINFER_BACKENDS:
            name = f"flashinfer_{backend}"
            try:
                started = time.perf_counter()
                call = flashinfer_call(backend, q, kv_cache, tables, seq_len)
                err = (call().float() - reference).abs().max().item()
                first_s = time.perf_counter() - started  # the JIT compile on a module's first use
            except Exception as exc:  # noqa: BLE001 - a library that cannot run is a result
                found.append({"library": name, "error": f"{type(exc).__name__}: {exc}"[:400]})
                continue
            row = timed_row(name, functools.partial(median_ms, call), flops, mm_tflops)
            found.append({**row, "max_abs_diff_vs_cudnn": err, "first_call_s": first_s})
        for row in found:
            row.update(qlen=qlen, seq_len=seq_len)
            print_row(row, f"{row['library']:16s}")
        rows += found
        del q, kv_cache
    return rows


# (new rows, sequence length): the 32 x 32K run's steps and whole prompts
PLAN_SHAPES = [(8192, 8192), (8192, 32768), (2048, 32768), (32768, 32768)]


def plan_rows(mm_tflops: float) -> list[dict]:
    from kvserve.layers.attention.cudnn_prefill import CudnnPrefill

    rows = []
    for qlen, seq_len in PLAN_SHAPES:
        q, kv_cache, qsl, seq_lens, tables = prefill_inputs(seq_len, qlen)
        library = CudnnPrefill(q.device)
        call = cudnn_paged_call(q, kv_cache, qsl, seq_lens, tables, library=library)
        reference = call().float()
        for index, name in enumerate(library.plan_names()):
            try:
                library.use_plan(index)
                err = (call().float() - reference).abs().max().item()
            except Exception as exc:  # noqa: BLE001 - a plan that does not build is a result
                row = {"library": "cudnn_paged", "error": f"{type(exc).__name__}: {exc}"[:400]}
            else:
                flops = attention_flops(qlen, seq_len)
                row = timed_row("cudnn_paged", functools.partial(median_ms, call), flops, mm_tflops)
                row["max_abs_diff_vs_first_plan"] = err
            rows.append({**row, "plan": index, "plan_name": name, "qlen": qlen, "seq_len": seq_len})
            print_row(rows[-1], f"plan {index} {name:24s}")
        del q, kv_cache
    return rows


def print_row(row: dict, label: str) -> None:
    """One line a timed (or failed) row: its step, ``label``, then time and rate or the error."""
    timing = f"{row['ms']:8.3f} ms {row['tflops']:5.0f} TFLOP/s" if "ms" in row else row["error"]
    print(f"q={row['qlen']:6d} L={row['seq_len']:6d} {label} {timing}", flush=True)


def timed_row(name: str, run: Callable[[], float], flops: float, mm_tflops: float) -> dict:
    try:
        ms = run()
    except Exception as exc:  # noqa: BLE001 - a library that cannot run a shape is a result
        return {"library": name, "error": f"{type(exc).__name__}: {exc}"[:400]}
    tflops = flops / ms / 1e9
    return {"library": name, "ms": ms, "tflops": tflops, "of_matmul": tflops / mm_tflops}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=None)
    ap.add_argument(
        "--parts",
        default="libraries",
        help="libraries, flashinfer, plans, buckets, pages (comma list)",
    )
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    mm_tflops = matmul_tflops()
    versions = {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version()}
    try:
        import cudnn

        versions["cudnn_frontend"] = cudnn.__version__
        versions["cudnn_backend"] = cudnn.backend_version()
    except Exception as exc:  # noqa: BLE001
        versions["cudnn_frontend"] = f"unavailable: {exc}"
    print(f"bf16 matmul {mm_tflops:.0f} TFLOP/s; {versions}", flush=True)
    rows, gathers, buckets, pages, flashinfer, plans = [], [], [], [], [], []
    if "libraries" in parts:
        for qlen, seq_len in SHAPES:
            rows += library_rows(qlen, seq_len, mm_tflops)
        gathers = [{"seq_len": n, "gather_ms": gather_ms(n)} for n in (32768, 131072)]
        print(gathers, flush=True)
    if "flashinfer" in parts:
        flashinfer = flashinfer_rows(mm_tflops)
        versions["flashinfer"] = _flashinfer_version()
    if "plans" in parts:
        plans = plan_rows(mm_tflops)
    if "buckets" in parts:
        buckets = bucket_rows(mm_tflops)
    if "pages" in parts:
        pages = page_rows(mm_tflops)
    # The first matmul of a fresh process can read high (795 TFLOP/s on the H200 against
    # 679-701 later in other runs): shares are against the rate after the sustained load above
    sustained = matmul_tflops()
    for row in rows + flashinfer + plans + buckets + pages:
        if "tflops" in row:
            row["of_matmul"] = row["tflops"] / sustained
    write_result(
        "attention_libraries",
        {"matmul_tflops": sustained, "matmul_tflops_at_start": mm_tflops, "versions": versions,
         "rows": rows, "gather": gathers, "flashinfer": flashinfer, "plans": plans,
         "buckets": buckets,
         "pages": pages,
         "shape": {"hq": HQ, "hkv": HKV, "head_dim": HEAD_DIM, "page": PAGE}},
        args.out_dir,
    )  # fmt: skip


def _flashinfer_version() -> str:
    try:
        import flashinfer

        return flashinfer.__version__
    except Exception as exc:  # noqa: BLE001
        return f"unavailable: {exc}"


if __name__ == "__main__":
    main()
