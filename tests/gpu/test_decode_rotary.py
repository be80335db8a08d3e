"""The decode attention kernel with rotary folded in (``decode_rotary.py``: q, k and v read
from the qkv output, q/k norm and partial rotary, the newest k/v stored by the split holding
that token) against ``rotary_store_kv`` followed by the plain decode kernel."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("triton")

from kernel_test_device import DEVICE, INTERPRETED, NEEDS_CUDA_GRAPHS  # noqa: E402
from test_attention_kernels import SM90, make_batch  # noqa: E402
from test_elementwise_kernels import cos_sin_cache, qk_norm_weights  # noqa: E402

from kvserve.kernels.activation import silu_and_mul  # noqa: E402
from kvserve.kernels.decode_attention import DecodeConfig, paged_decode_attention  # noqa: E402
from kvserve.kernels.decode_rotary import DecodeRotary  # noqa: E402
from kvserve.kernels.rmsnorm import rms_norm  # noqa: E402
from kvserve.kernels.rotary_store_kv import rotary_store_kv  # noqa: E402

pytestmark = pytest.mark.gpu

# bf16 on the GPU; Triton's interpreter (make test) computes bf16 wrongly, fp16 there
HALF = torch.float16 if INTERPRETED else torch.bfloat16
# (Hq, Hkv, head_dim, rotary dims, q/k norm, dtype, FP8 cache): Llama, Qwen3, GLM-4.5's
# partial rotary, fp32, an FP8 cache with Qwen3's norm
CASES = [
    (32, 8, 128, 128, False, HALF, False),
    (32, 4, 128, 128, True, HALF, False),
    (12, 4, 128, 64, True, HALF, False),
    (16, 4, 64, 64, False, torch.float32, False),
    (32, 4, 128, 128, True, HALF, True),
]
CASE_IDS = ["llama", "qwen3", "glm-partial", "fp32", "qwen3-fp8-cache"]
# forced splits (with and without the fused merge) and one split (the direct store)
CONFIGS = [None, DecodeConfig(num_splits=8), DecodeConfig(num_splits=8, fused_merge=True),
           DecodeConfig(num_splits=1)]  # fmt: skip
SEQ_LENS = [1, 17, 700, 2048, 64, 0]  # the last row a CUDA-graph batch's padding


def _step(hq: int, hkv: int, head_dim: int, rot: int, norm: bool, dtype: torch.dtype,
          fp8: bool):  # fmt: skip
    """(qkv with padded rows, DecodeRotary, cache, k/v scales, batch metadata)."""
    heads = {"num_heads": hq, "num_kv_heads": hkv, "head_dim": head_dim}
    b = make_batch([1] * len(SEQ_LENS), [max(s, 1) for s in SEQ_LENS], page_size=16, **heads,
                   dtype=dtype, seed=rot)  # fmt: skip
    b.meta.seq_lens[-1], b.meta.slot_mapping[-1] = 0, -1
    width = (hq + 2 * hkv) * head_dim
    gen = torch.Generator().manual_seed(hq + rot)
    qkv = torch.randn(len(SEQ_LENS), width + 64, generator=gen).to(dtype).to(DEVICE)[:, :width]
    positions = (b.meta.seq_lens.long() - 1).clamp(min=0)
    norms = qk_norm_weights(head_dim, dtype) if norm else None
    rotary = DecodeRotary(qkv, positions, cos_sin_cache(4096, rot), b.meta.slot_mapping, norms)
    cache, scales = b.kv_cache, None
    if fp8:
        cache = b.kv_cache.float().to(torch.float8_e4m3fn)
        scales = (torch.tensor([0.05], device=DEVICE), torch.tensor([0.02], device=DEVICE))
    return rotary, cache, scales, b.meta


@pytest.mark.parametrize("config", CONFIGS, ids=["default", "splits8", "splits8-fused", "one"])
@pytest.mark.parametrize(("hq", "hkv", "head_dim", "rot", "norm", "dtype", "fp8"), CASES,
                         ids=CASE_IDS)  # fmt: skip
def test_decode_rotary_matches_rotary_store_then_decode(
    hq: int, hkv: int, head_dim: int, rot: int, norm: bool, dtype: torch.dtype, fp8: bool,
    config: DecodeConfig | None,
) -> None:  # fmt: skip
    rotary, cache, scales, meta = _step(hq, hkv, head_dim, rot, norm, dtype, fp8)
    scale = 1.0 / math.sqrt(head_dim)
    before, unfused = cache.clone(), cache.clone()
    q = rotary_store_kv(rotary.qkv, rotary.positions, rotary.cos_sin_cache, unfused,
                        meta.slot_mapping, hq, hkv, head_dim, kv_scales=scales,
                        qk_norm=rotary.qk_norm)  # fmt: skip
    want = paged_decode_attention(q, unfused, meta.block_tables, meta.seq_lens, scale,
                                  kv_scales=scales, config=config)  # fmt: skip
    got = paged_decode_attention(rotary.q_view(hq, head_dim), cache, meta.block_tables,
                                 meta.seq_lens, scale, kv_scales=scales, config=config,
                                 rotary=rotary)  # fmt: skip
    # The newest token's score is summed over D in another order than the tile MMA's
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    assert not got[-1].any()  # the padding row: zeros, nothing stored
    assert torch.equal(cache[1], unfused[1])  # v stored as it is
    if fp8:  # k: at most one e4m3 step apart where fp32 roundings differ
        diff = (cache[0].float() - unfused[0].float()).abs()
        assert (diff <= unfused[0].float().abs() * 2**-3 + 2**-9).all()
    else:
        torch.testing.assert_close(cache[0], unfused[0], atol=tol, rtol=tol)
    stored = torch.zeros(cache[0].flatten(0, 1).shape[0], dtype=torch.bool, device=DEVICE)
    stored[meta.slot_mapping[meta.slot_mapping >= 0]] = True
    assert torch.equal(cache.flatten(1, 2)[:, ~stored], before.flatten(1, 2)[:, ~stored])


@NEEDS_CUDA_GRAPHS
@pytest.mark.skipif(not SM90, reason="programmatic dependent launch needs sm_90+")
def test_decode_rotary_in_a_pdl_chain_replays_bit_equal() -> None:
    """The qkv output written by the kernel just before (a norm here), the positions, slots and
    the first tile read ahead of the wait: launched with PDL from a graph, replayed many times,
    bit-equal to plain launches."""
    rotary, cache, _, meta = _step(32, 4, 128, 128, True, torch.bfloat16, False)
    cache0 = cache.clone()
    raw = rotary.qkv.clone()
    weight = torch.rand(raw.shape[1], device=DEVICE, dtype=torch.bfloat16) + 0.5

    def step(pdl: bool) -> torch.Tensor:
        qkv = rms_norm(raw, weight, 1e-6, pdl=pdl)
        rot = DecodeRotary(qkv, rotary.positions, rotary.cos_sin_cache, meta.slot_mapping,
                           rotary.qk_norm)  # fmt: skip
        attn = paged_decode_attention(rot.q_view(32, 128), cache, meta.block_tables,
                                      meta.seq_lens, 128**-0.5, pdl=pdl, rotary=rot)  # fmt: skip
        return silu_and_mul(attn.flatten(1), pdl=pdl)

    expected = step(pdl=False)
    expected_cache = cache.clone()
    cache.copy_(cache0)
    assert torch.equal(step(pdl=True), expected)  # eager (and compiled outside the capture)
    assert torch.equal(cache, expected_cache)
    cache.copy_(cache0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(pdl=True)
    for _ in range(20):
        cache.copy_(cache0)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, expected)
        assert torch.equal(cache, expected_cache)
