"""Whether a mixed step's decode attention can hide under its prefill attention: one layer of
the 32 x 32K run's typical step (4 prefill chunks of 2K rows at 30K-32K context through cuDNN;
25 decode rows at 32K through the Triton decode kernel), timed alone, one after the other on one
stream (what the engine does), and at once on two streams (decode on a higher-priority stream,
launched just after the prefill), for decode split counts from the default down to one program
per SM. The decode rows' KV reads are a fixed 8.3 s of that run's 49.5 s; the prefill
attention is compute-bound and leaves DRAM mostly idle: this measures how much of the decode's
reads fit under it.

    python -m benchmarks.mixed_step_overlap [--out-dir DIR]

Writes mixed_step_overlap_<date>.json: ms per variant and the share of the decode's own time
the concurrent launch hid (``hidden``). On the H200 (2026-12-02) it hid 15% at the default
split count and less at fewer programs a SM, so the engine keeps a mixed step on one stream.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.common import median_ms, write_result
from benchmarks.kernels_h200 import DTYPE, HEAD_DIM, HKV, HQ, PAGE, SCALE
from kvserve.kernels.decode_attention import DecodeConfig, paged_decode_attention
from kvserve.layers.attention.cudnn_prefill import CudnnPrefill, pad_step_inputs
from kvserve.layers.attention.metadata import AttentionMetadata

CONTEXT = 32768
CHUNK = 2048
PREFILLS = 4  # chunks of a step (8K-token budget)
DECODES = 25  # the rest of the 26 sequences the bf16 pool holds
PROGRAMS_PER_SM = [None, 2, 1]  # None: the kernel's default


def _prefill_step(first_page: int) -> tuple[torch.Tensor, AttentionMetadata]:
    """Four chunks ending at 30K / 31K / 32K / 32K, pages in random order: q and metadata."""
    ends = [CONTEXT - 2048, CONTEXT - 1024, CONTEXT, CONTEXT]
    pages = CONTEXT // PAGE
    perm = first_page + torch.randperm(PREFILLS * pages, device="cuda").to(torch.int32)
    tables = perm.view(PREFILLS, pages)
    starts = [i * CHUNK for i in range(PREFILLS + 1)]
    meta = AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device="cuda"),
        seq_lens=torch.tensor(ends, dtype=torch.int32, device="cuda"),
        block_tables=tables, slot_mapping=torch.empty(0, dtype=torch.int64, device="cuda"),
        max_query_len=CHUNK, max_seq_len=CONTEXT, query_lens_cpu=[CHUNK] * PREFILLS,
        seq_lens_cpu=ends,
    )  # fmt: skip
    q = torch.randn(PREFILLS * CHUNK, HQ, HEAD_DIM, dtype=DTYPE, device="cuda")
    return q, meta


def _decode_step(first_page: int) -> tuple[torch.Tensor, ...]:
    pages = CONTEXT // PAGE
    perm = first_page + torch.randperm(DECODES * pages, device="cuda").to(torch.int32)
    q = torch.randn(DECODES, HQ, HEAD_DIM, dtype=DTYPE, device="cuda")
    seq_lens = torch.full((DECODES,), CONTEXT, dtype=torch.int32, device="cuda")
    return q, perm.view(DECODES, pages), seq_lens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args()
    prefill_pages = PREFILLS * CONTEXT // PAGE
    num_pages = prefill_pages + DECODES * CONTEXT // PAGE
    kv_cache = torch.randn(2, num_pages, PAGE, HKV, HEAD_DIM, dtype=DTYPE, device="cuda")
    q_pre, meta = _prefill_step(0)
    q_dec, tables, seq_lens = _decode_step(prefill_pages)
    library = CudnnPrefill(q_pre.device)
    inputs = pad_step_inputs(meta, 0, PREFILLS)
    side = torch.cuda.Stream(priority=-1)  # the highest priority torch offers
    rows = []
    for per_sm in PROGRAMS_PER_SM:
        config = DecodeConfig() if per_sm is None else DecodeConfig(programs_per_sm=per_sm)
        out = torch.empty_like(q_dec)

        def prefill() -> None:
            library(q_pre, kv_cache, inputs, SCALE)

        def decode(config: DecodeConfig = config, out: torch.Tensor = out) -> None:
            paged_decode_attention(q_dec, kv_cache, tables, seq_lens, SCALE, out=out,
                                   config=config)  # fmt: skip

        def sequential() -> None:
            decode()
            prefill()

        def concurrent() -> None:
            main = torch.cuda.current_stream()
            side.wait_stream(main)
            prefill()
            with torch.cuda.stream(side):
                decode()
            main.wait_stream(side)

        row = {"programs_per_sm": per_sm or "default"}
        for name, run in (("prefill", prefill), ("decode", decode), ("sequential", sequential),
                          ("concurrent", concurrent)):  # fmt: skip
            row[f"{name}_ms"] = median_ms(run)  # the side stream joins the timed one
        row["hidden"] = (row["sequential_ms"] - row["concurrent_ms"]) / row["decode_ms"]
        rows.append(row)
        print(row, flush=True)
    write_result(
        "mixed_step_overlap",
        {"rows": rows, "shape": {"context": CONTEXT, "chunk": CHUNK, "prefills": PREFILLS,
                                 "decodes": DECODES, "hq": HQ, "hkv": HKV, "page": PAGE}},
        args.out_dir,
    )  # fmt: skip


if __name__ == "__main__":
    main()
