"""Prefill attention at long context: kvserve's paged Triton kernel against the attention
libraries a Hopper node already has or can carry as a wheel, on the shapes a long prompt's
prefill launches (a whole prompt; a chunk of new rows behind a cached prefix).

- ``triton``: ``paged_prefill_attention``, pages in random order (as the engine's pool).
- ``sdpa_flash`` / ``sdpa_cudnn``: torch's SDPA on contiguous [1, H, L, D] keys (bottom-right
  causal for a chunk, GQA by ``enable_gqa``); ``gather_ms`` is what copying a sequence's pages
  into such a buffer costs.
- ``cudnn_paged``: cuDNN's SDPA through ``nvidia-cudnn-frontend`` reading the paged cache in
  place (page table, bottom-right causal); its output is checked against the Triton kernel's.

Causal FLOPs (4 per query-key pair and dim) against a bf16 matmul measured in the same run.
Llama-3-8B heads (32 q, 8 kv, D = 128), bf16, page 16.

    python -m benchmarks.attention_libraries [--out-dir DIR]
"""

from __future__ import annotations

import argparse
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


class CudnnPagedPrefill:
    """One cuDNN SDPA graph for one sequence: q [T, Hq, D], the cache read through its page
    table with bottom-right causal masking."""

    def __init__(self, q: torch.Tensor, kv_cache: torch.Tensor, tables: torch.Tensor) -> None:
        import cudnn

        qlen, seq_len = q.shape[0], tables.shape[1] * PAGE
        self.q = q.unsqueeze(0).permute(0, 2, 1, 3)  # [1, Hq, T, D], token-major in memory
        self.out = torch.empty_like(q).unsqueeze(0).permute(0, 2, 1, 3)
        self.k = kv_cache[0].permute(0, 2, 1, 3)  # [pages, Hkv, PAGE, D]
        self.v = kv_cache[1].permute(0, 2, 1, 3)
        self.table = tables[:, None, :, None].contiguous()  # [1, 1, pages, 1]
        self.seq_q = torch.full((1, 1, 1, 1), qlen, dtype=torch.int32, device="cuda")
        self.seq_kv = torch.full((1, 1, 1, 1), seq_len, dtype=torch.int32, device="cuda")
        graph = cudnn.pygraph(
            io_data_type=cudnn.data_type.BFLOAT16,
            intermediate_data_type=cudnn.data_type.FLOAT,
            compute_data_type=cudnn.data_type.FLOAT,
        )
        self.tensors = {
            name: graph.tensor_like(t)
            for name, t in [("q", self.q), ("k", self.k), ("v", self.v), ("table", self.table),
                            ("seq_q", self.seq_q), ("seq_kv", self.seq_kv)]
        }  # fmt: skip
        t = self.tensors
        o, _ = graph.sdpa(
            name="sdpa", q=t["q"], k=t["k"], v=t["v"], is_inference=True, attn_scale=SCALE,
            use_causal_mask_bottom_right=True, use_padding_mask=True, seq_len_q=t["seq_q"],
            seq_len_kv=t["seq_kv"], paged_attention_k_table=t["table"],
            paged_attention_v_table=t["table"], paged_attention_max_seq_len_kv=seq_len,
        )  # fmt: skip
        o.set_output(True).set_dim(list(self.out.shape)).set_stride(list(self.out.stride()))
        t["o"] = o
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.check_support()
        graph.build_plans()
        self.graph = graph
        self.workspace = torch.empty(graph.get_workspace_size(), dtype=torch.uint8, device="cuda")

    def __call__(self) -> torch.Tensor:
        t = self.tensors
        pack = {t["q"]: self.q, t["k"]: self.k, t["v"]: self.v, t["table"]: self.table,
                t["seq_q"]: self.seq_q, t["seq_kv"]: self.seq_kv, t["o"]: self.out}  # fmt: skip
        self.graph.execute(pack, self.workspace)
        return self.out.permute(0, 2, 1, 3)[0]  # [T, Hq, D]


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
        cudnn_call = CudnnPagedPrefill(q, kv_cache, tables)
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
    args = ap.parse_args()
    mm_tflops = matmul_tflops()
    versions = {"torch": torch.__version__, "cudnn": torch.backends.cudnn.version()}
    try:
        import cudnn

        versions["cudnn_frontend"] = cudnn.__version__
        versions["cudnn_backend"] = cudnn.backend_version()
    except Exception as exc:  # noqa: BLE001
        versions["cudnn_frontend"] = f"unavailable: {exc}"
    print(f"bf16 matmul {mm_tflops:.0f} TFLOP/s; {versions}", flush=True)
    rows = []
    for qlen, seq_len in SHAPES:
        rows += library_rows(qlen, seq_len, mm_tflops)
    gathers = [{"seq_len": n, "gather_ms": gather_ms(n)} for n in (32768, 131072)]
    print(gathers, flush=True)
    write_result(
        "attention_libraries",
        {"matmul_tflops": mm_tflops, "versions": versions, "rows": rows, "gather": gathers,
         "shape": {"hq": HQ, "hkv": HKV, "head_dim": HEAD_DIM, "page": PAGE}},
        args.out_dir,
    )  # fmt: skip


if __name__ == "__main__":
    main()
