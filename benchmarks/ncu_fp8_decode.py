"""One 32 x 32K decode-attention call (Llama-3-8B heads, page 16, random page order), run
three times, for Nsight Compute to profile the third:

    ncu --clock-control none --section SpeedOfLight --section Occupancy \\
        --section MemoryWorkloadAnalysis_Tables --print-details all \\
        -k regex:decode_split --launch-skip 2 -c 1 python -m benchmarks.ncu_fp8_decode fp8

``bf16``: the bf16 cache at ``DecodeConfig()``; ``fp8``: the FP8 cache at
``FP8_DECODE_CONFIG``. ``SEQ_PAGES=1`` gives each sequence consecutive pages instead.
"""

from __future__ import annotations

import os
import sys

import torch

from kvserve.kernels.decode_attention import FP8_DECODE_CONFIG, DecodeConfig, paged_decode_attention

BATCH, CONTEXT, HQ, HKV, HEAD_DIM, PAGE = 32, 32768, 32, 8, 128, 16


def main() -> None:
    fp8 = sys.argv[1:] == ["fp8"]
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    pages = BATCH * CONTEXT // PAGE + 64
    cache = torch.randn(2, pages, PAGE, HKV, HEAD_DIM, device="cuda").to(dtype)
    sequential = os.environ.get("SEQ_PAGES") == "1"
    order = torch.arange(pages) if sequential else torch.randperm(pages)
    tables = order[: BATCH * CONTEXT // PAGE].view(BATCH, -1).to(torch.int32).cuda()
    lens = torch.full((BATCH,), CONTEXT, dtype=torch.int32, device="cuda")
    q = torch.randn(BATCH, HQ, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    scales = (torch.tensor([0.05], device="cuda"), torch.tensor([0.05], device="cuda"))
    config = FP8_DECODE_CONFIG if fp8 else DecodeConfig()
    for _ in range(3):
        paged_decode_attention(q, cache, tables, lens, HEAD_DIM**-0.5, None,
                               scales if fp8 else None, config=config)  # fmt: skip
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
