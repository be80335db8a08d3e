"""The attention path's kernels built for sm_90 as a decode or prefill step launches them:
paged decode attention (bf16 and FP8 caches; one split, balanced splits over a few long
sequences, full batches of short ones; the merge kernel or the fused merge; dependent launch
with the early loads), paged prefill attention (a whole prompt, a chunk of a long one with its
key/value splits), and q/k rotary with the cache store (Llama, Qwen3's q/k norm, GLM's partial
rotary), for Llama-3-8B, Qwen3-30B-A3B and GLM-4.5-Air heads."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from triton_target import stack_bytes  # noqa: E402

from kvserve.kernels.decode_attention import paged_decode_attention  # noqa: E402
from kvserve.kernels.prefill_attention import paged_prefill_attention  # noqa: E402
from kvserve.kernels.rotary_store_kv import QKNorm, rotary_store_kv  # noqa: E402
from kvserve.kernels.store_kv_cache import store_kv_cache  # noqa: E402

PAGE = 16
HEAD_DIM = 128
# (q heads, kv heads) of Llama-3-8B, Qwen3-30B-A3B and GLM-4.5-Air
HEADS = {"llama": (32, 8), "qwen3-moe": (32, 4), "glm-air": (96, 8)}
CACHES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}


def _cache(kv_heads: int, dtype: torch.dtype) -> tuple[torch.Tensor, tuple | None]:
    """A few pages (nothing is read: only the launch's shapes and dtypes matter), and an FP8
    cache's k/v scales."""
    cache = torch.zeros(2, 8, PAGE, kv_heads, HEAD_DIM, dtype=dtype)
    scales = (torch.ones(1), torch.ones(1)) if dtype == torch.float8_e4m3fn else None
    return cache, scales


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("model", HEADS)
@pytest.mark.parametrize(("batch", "context"), [(1, 1024), (32, 32768), (64, 1024), (256, 1024)])
def test_decode_attention_builds_for_sm90_without_spills(
    compile_only: list, cache: str, model: str, batch: int, context: int
) -> None:
    q_heads, kv_heads = HEADS[model]
    kv_cache, scales = _cache(kv_heads, CACHES[cache])
    q = torch.zeros(batch, q_heads, HEAD_DIM, dtype=torch.bfloat16)
    tables = torch.zeros(batch, context // PAGE, dtype=torch.int32)
    lengths = torch.full((batch,), context, dtype=torch.int32)
    paged_decode_attention(q, kv_cache, tables, lengths, HEAD_DIM**-0.5, kv_scales=scales,
                           pdl=True)  # fmt: skip
    assert stack_bytes(compile_only) == [0] * len(compile_only)


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("model", HEADS)
@pytest.mark.parametrize(("tokens", "context"), [(512, 512), (2048, 32768)])
def test_prefill_attention_builds_for_sm90_without_spills(
    compile_only: list, cache: str, model: str, tokens: int, context: int
) -> None:
    """One sequence: a whole prompt, or a 2K chunk at the end of a 32K one (its key/value range
    split across programs)."""
    q_heads, kv_heads = HEADS[model]
    kv_cache, scales = _cache(kv_heads, CACHES[cache])
    q = torch.zeros(tokens, q_heads, HEAD_DIM, dtype=torch.bfloat16)
    starts = torch.tensor([0, tokens], dtype=torch.int32)
    lengths = torch.tensor([context], dtype=torch.int32)
    tables = torch.zeros(1, context // PAGE, dtype=torch.int32)
    paged_prefill_attention(q, kv_cache, starts, lengths, tables, tokens, HEAD_DIM**-0.5,
                            scales, max_seq_len=context)  # fmt: skip
    assert stack_bytes(compile_only) == [0] * len(compile_only)


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("model", ["llama", "qwen3-moe", "glm-air"])
@pytest.mark.parametrize("tokens", [1, 256])
def test_rotary_and_the_cache_store_build_for_sm90_without_spills(
    compile_only: list, cache: str, model: str, tokens: int
) -> None:
    """q/k rotary with the new keys and values stored (Qwen3 with its q/k norm, GLM rotating
    half of each head), and the plain store a step without rotary uses."""
    q_heads, kv_heads = HEADS[model]
    kv_cache, scales = _cache(kv_heads, CACHES[cache])
    qkv = torch.zeros(tokens, (q_heads + 2 * kv_heads) * HEAD_DIM, dtype=torch.bfloat16)
    positions = torch.zeros(tokens, dtype=torch.int64)
    slots = torch.zeros(tokens, dtype=torch.int64)
    rotary_dim = HEAD_DIM // 2 if model == "glm-air" else HEAD_DIM
    cos_sin = torch.zeros(4096, rotary_dim)
    norm = None
    if model == "qwen3-moe":
        norm = QKNorm(torch.ones(HEAD_DIM), torch.ones(HEAD_DIM), 1e-6)
    rotary_store_kv(qkv, positions, cos_sin, kv_cache, slots, q_heads, kv_heads, HEAD_DIM,
                    kv_scales=scales, qk_norm=norm, pdl=True)  # fmt: skip
    k = torch.zeros(tokens, kv_heads, HEAD_DIM, dtype=torch.bfloat16)
    store_kv_cache(k, k, kv_cache, slots, scales, pdl=True)
    assert stack_bytes(compile_only) == [0] * len(compile_only)
