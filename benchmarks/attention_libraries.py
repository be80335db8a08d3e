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

``--parts widths``: cuDNN's speed on the same sequence with its page table as wide as the
sequence and as wide as a 128K context (one graph width for every step, if it costs nothing).

Causal FLOPs (4 per query-key pair and dim) against a bf16 matmul measured in the same run.
Llama-3-8B heads (32 q, 8 kv, D = 128), bf16, page 16.

    python -m benchmarks.attention_libraries [--parts libraries,widths] [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from benchmarks.common import matmul_tflops, median_ms, write_result
from benchmarks.kernels_h200 import DTYPE, HEAD_DIM, HKV, HQ, PAGE, SCALE, prefill_inputs
from benchmarks.long_context_sweep import attention_flops
from kvserve.kernels.prefill_attention import paged_prefill_attention

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
    width: int | None = None,
) -> Callable[[], torch.Tensor]:
    """The engine's cuDNN prefill (``CudnnPrefill``) on one sequence's step; ``width``: its page
    table padded with zeros to that many columns (the graph takes the next power of two)."""
    from kvserve.layers.attention.cudnn_prefill import CudnnPrefill
    from kvserve.layers.attention.metadata import AttentionMetadata

    qlen, seq_len = q.shape[0], tables.shape[1] * PAGE
    if width is not None and width > tables.shape[1]:
        tables = torch.nn.functional.pad(tables, (0, width - tables.shape[1]))
    meta = AttentionMetadata(
        query_start_loc=qsl, seq_lens=seq_lens, block_tables=tables,
        slot_mapping=torch.empty(0, dtype=torch.int64, device=q.device), max_query_len=qlen,
        max_seq_len=seq_len, query_lens_cpu=[qlen], seq_lens_cpu=[seq_len],
    )  # fmt: skip
    library = CudnnPrefill(q.device)
    inputs = library.step_inputs(meta, 0)
    assert inputs is not None, "below the size the engine hands to cuDNN"
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
        tf = row.get("tflops")
        print(f"q={qlen:6d} L={seq_len:6d} {row['library']:12s} "
              + (f"{row['ms']:8.2f} ms {tf:5.0f} TFLOP/s" if tf else row.get("error", "")),
              flush=True)  # fmt: skip
    return rows


# (new rows, sequence length): whether a graph built for a wide page table (the engine's
# longest context, so that one width serves every step) reads a short sequence as fast
WIDTH_SHAPES = [(2048, 4096), (2048, 32768), (16384, 32768)]
WIDE_TABLE = 131072 // PAGE


def width_rows(mm_tflops: float) -> list[dict]:
    rows = []
    for qlen, seq_len in WIDTH_SHAPES:
        q, kv_cache, qsl, seq_lens, tables = prefill_inputs(seq_len, qlen)
        for width in (tables.shape[1], WIDE_TABLE):
            call = cudnn_paged_call(q, kv_cache, qsl, seq_lens, tables, width)
            run = functools.partial(median_ms, call)
            row = timed_row("cudnn_paged", run, attention_flops(qlen, seq_len), mm_tflops)
            rows.append({**row, "qlen": qlen, "seq_len": seq_len, "table_width": width})
            print(f"q={qlen:6d} L={seq_len:6d} table width {width:5d}: "
                  f"{row.get('tflops', float('nan')):5.0f} TFLOP/s", flush=True)  # fmt: skip
    return rows


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
    ap.add_argument("--parts", default="libraries", help="libraries, widths (comma list)")
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
    rows, gathers, widths = [], [], []
    if "libraries" in parts:
        for qlen, seq_len in SHAPES:
            rows += library_rows(qlen, seq_len, mm_tflops)
        gathers = [{"seq_len": n, "gather_ms": gather_ms(n)} for n in (32768, 131072)]
        print(gathers, flush=True)
    if "widths" in parts:
        widths = width_rows(mm_tflops)
    # The first matmul of a fresh process can read high (795 TFLOP/s on the H200 against
    # 679-701 later in other runs): shares are against the rate after the sustained load above
    sustained = matmul_tflops()
    for row in rows + widths:
        if "tflops" in row:
            row["of_matmul"] = row["tflops"] / sustained
    write_result(
        "attention_libraries",
        {"matmul_tflops": sustained, "matmul_tflops_at_start": mm_tflops, "versions": versions,
         "rows": rows, "gather": gathers, "table_widths": widths,
         "shape": {"hq": HQ, "hkv": HKV, "head_dim": HEAD_DIM, "page": PAGE}},
        args.out_dir,
    )  # fmt: skip


if __name__ == "__main__":
    main()
