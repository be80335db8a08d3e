"""RMSNorm, rotary (alone and fused with the KV store) and SiLU-and-mul Triton kernels against
their torch references.

``KVSERVE_TEST_DEVICE=cpu TRITON_INTERPRET=1 pytest --noconftest`` runs these through Triton's
interpreter on a CPU; bf16 is broken there, so the fused-kernel tests skip it under the
interpreter."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

pytest.importorskip("triton")

from kernel_test_device import BF16_UNLESS_INTERPRETED, DEVICE, INTERPRETED  # noqa: E402

from kvserve.kernels.activation import silu_and_mul, silu_and_mul_reference  # noqa: E402
from kvserve.kernels.rmsnorm import (  # noqa: E402
    fused_add_rms_norm,
    fused_add_rms_norm_reference,
    rms_norm,
    rms_norm_reference,
)
from kvserve.kernels.rotary import apply_rotary, apply_rotary_reference  # noqa: E402
from kvserve.kernels.rotary_store_kv import (  # noqa: E402
    QKNorm,
    rotary_store_kv,
    rotary_store_kv_reference,
)
from kvserve.kernels.store_kv_cache import store_kv_cache  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = [BF16_UNLESS_INTERPRETED, torch.float16, torch.float32]
# One rounding step of the dtype apart from the reference, at values of order 1.
TOL = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3, torch.float32: 1e-5}


def randn(*shape: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "hidden"), [(1, 64), (7, 1000), (33, 4096), (5, 8192)])
def test_rms_norm(rows: int, hidden: int, dtype: torch.dtype) -> None:
    x = randn(rows, hidden, dtype=dtype) * 3
    weight = randn(hidden, dtype=dtype, seed=1)
    out = rms_norm(x, weight, 1e-6)
    ref = rms_norm_reference(x, weight, 1e-6)
    assert out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, atol=TOL[dtype], rtol=TOL[dtype])


def test_rms_norm_strided_rows_and_fp32_weight() -> None:
    x = randn(9, 2048, dtype=torch.bfloat16)[:, :1024]  # rows 2048 apart
    weight = randn(1024, dtype=torch.float32, seed=2)
    out = rms_norm(x, weight, 1e-5)
    ref = rms_norm_reference(x, weight, 1e-5)
    assert out.dtype == torch.float32
    # The normalised value is rounded to bf16 before the fp32 weight: one bf16 step apart.
    tol = TOL[torch.bfloat16]
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "hidden"), [(3, 576), (64, 4096)])
def test_fused_add_rms_norm_updates_residual_in_place(
    rows: int, hidden: int, dtype: torch.dtype
) -> None:
    x = randn(rows, hidden, dtype=dtype)
    residual = randn(rows, hidden, dtype=dtype, seed=1)
    weight = randn(hidden, dtype=dtype, seed=2)
    ref_out, ref_residual = fused_add_rms_norm_reference(x, residual.clone(), weight, 1e-6)
    out, residual_out = fused_add_rms_norm(x, residual, weight, 1e-6)
    assert residual_out.data_ptr() == residual.data_ptr()
    assert torch.equal(residual_out, ref_residual)  # same single rounding of x + residual
    torch.testing.assert_close(out, ref_out, atol=TOL[dtype], rtol=TOL[dtype])


def cos_sin_cache(max_pos: int, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    freqs = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).float().to(DEVICE)  # [max_pos, D]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("tokens", "hq", "hkv", "head_dim"), [(1, 8, 8, 64), (37, 32, 8, 128), (200, 12, 2, 64)]
)
def test_apply_rotary(tokens: int, hq: int, hkv: int, head_dim: int, dtype: torch.dtype) -> None:
    cache = cos_sin_cache(20000, head_dim)
    gen = torch.Generator().manual_seed(3)
    positions = torch.randint(0, 20000, (tokens,), generator=gen).to(DEVICE)
    q = randn(tokens, hq * head_dim, dtype=dtype)
    k = randn(tokens, hkv * head_dim, dtype=dtype, seed=1)
    ref_q, ref_k = apply_rotary_reference(q, k, positions, cache, head_dim)
    out_q, out_k = apply_rotary(q, k, positions, cache, head_dim)
    assert out_q.data_ptr() == q.data_ptr() and out_k.data_ptr() == k.data_ptr()
    torch.testing.assert_close(out_q, ref_q, atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(out_k, ref_k, atol=TOL[dtype], rtol=TOL[dtype])


def test_apply_rotary_reference_matches_hf_formula() -> None:
    """rotate-half: q * cos + rotate_half(q) * sin, with cos/sin repeated over both halves."""
    head_dim, tokens = 64, 5
    cache = cos_sin_cache(100, head_dim)
    positions = torch.tensor([0, 1, 7, 50, 99], device=DEVICE)
    q = randn(tokens, 2 * head_dim, dtype=torch.float32)
    k = randn(tokens, head_dim, dtype=torch.float32, seed=1)
    ref_q, _ = apply_rotary_reference(q, k, positions, cache, head_dim)
    cos = cache[positions, : head_dim // 2].repeat(1, 2)[:, None, :]
    sin = cache[positions, head_dim // 2 :].repeat(1, 2)[:, None, :]
    qh = q.view(tokens, 2, head_dim)
    rotate_half = torch.cat((-qh[..., head_dim // 2 :], qh[..., : head_dim // 2]), dim=-1)
    hf = (qh * cos + rotate_half * sin).view_as(q)
    torch.testing.assert_close(ref_q, hf)


@dataclass
class FusedInputs:
    qkv: torch.Tensor  # [T, (Hq + 2 * Hkv) * D], rows possibly wider than that
    positions: torch.Tensor
    cos_sin: torch.Tensor
    kv_cache: torch.Tensor  # [2, P, page, Hkv, D], random: unwritten slots must stay as they are
    slots: torch.Tensor  # every 7th row from the 4th on is padding (-1)


def fused_inputs(
    head_dim: int, hq: int, hkv: int, page: int, tokens: int, dtype: torch.dtype, row_pad: int
) -> FusedInputs:
    gen = torch.Generator().manual_seed(tokens)
    width = (hq + 2 * hkv) * head_dim
    num_pages = -(-tokens // page) + 2
    slots = torch.randperm(num_pages * page, generator=gen)[:tokens]
    slots[3::7] = -1
    return FusedInputs(
        qkv=randn(tokens, width + row_pad, dtype=dtype)[:, :width],
        positions=torch.randint(0, 4096, (tokens,), generator=gen).to(DEVICE),
        cos_sin=cos_sin_cache(4096, head_dim),
        kv_cache=randn(2, num_pages, page, hkv, head_dim, dtype=dtype, seed=1),
        slots=slots.to(DEVICE),
    )


# (head_dim, Hq, Hkv, page_size, T): GQA ratios 1, 4 and 8; page sizes 1 and 16.
FUSED_SHAPES = [
    (64, 8, 8, 16, 1),
    (128, 32, 8, 16, 37),
    (64, 16, 2, 1, 300),
    (128, 8, 1, 1, 130),
    (64, 4, 4, 1, 64),
    (128, 16, 2, 16, 200),
]
FUSED_IDS = [f"d{d}-q{hq}-kv{hkv}-p{p}-t{t}" for d, hq, hkv, p, t in FUSED_SHAPES]


@pytest.mark.parametrize("row_pad", [0, 96], ids=["dense", "wide-rows"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("head_dim", "hq", "hkv", "page", "tokens"), FUSED_SHAPES, ids=FUSED_IDS)
def test_rotary_store_kv_matches_reference(
    head_dim: int, hq: int, hkv: int, page: int, tokens: int, dtype: torch.dtype, row_pad: int
) -> None:
    x = fused_inputs(head_dim, hq, hkv, page, tokens, dtype, row_pad)
    before, expected = x.kv_cache.clone(), x.kv_cache.clone()
    args = (x.qkv, x.positions, x.cos_sin)
    ref_q = rotary_store_kv_reference(*args, expected, x.slots, hq, hkv, head_dim)
    q = rotary_store_kv(*args, x.kv_cache, x.slots, hq, hkv, head_dim)
    assert q.shape == (tokens, hq, head_dim) and q.is_contiguous()
    torch.testing.assert_close(q, ref_q, atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(x.kv_cache[0], expected[0], atol=TOL[dtype], rtol=TOL[dtype])
    assert torch.equal(x.kv_cache[1], expected[1])  # v is copied as it is
    untouched = torch.ones(before[0].flatten(0, 1).shape[0], dtype=torch.bool, device=DEVICE)
    untouched[x.slots[x.slots >= 0]] = False
    # Padding rows and slots of other tokens: bit for bit what was there.
    assert torch.equal(x.kv_cache.flatten(1, 2)[:, untouched], before.flatten(1, 2)[:, untouched])


@pytest.mark.parametrize("dtype", [BF16_UNLESS_INTERPRETED, torch.float32])
def test_rotary_store_kv_equals_unfused_kernels_bit_for_bit(dtype: torch.dtype) -> None:
    """Same fp32 math as rotary + store, so the fused decoder path changes no result."""
    head_dim, hq, hkv, page, tokens = 128, 32, 8, 16, 64
    x = fused_inputs(head_dim, hq, hkv, page, tokens, dtype, row_pad=128)
    unfused_cache = x.kv_cache.clone()
    q, k, v = x.qkv.split([hq * head_dim, hkv * head_dim, hkv * head_dim], dim=-1)
    q, k = apply_rotary(q.contiguous(), k.contiguous(), x.positions, x.cos_sin, head_dim)
    kv_heads = (tokens, hkv, head_dim)
    store_kv_cache(k.view(kv_heads), v.contiguous().view(kv_heads), unfused_cache, x.slots)
    q_out = torch.full((tokens, hq, head_dim), float("nan"), dtype=dtype, device=DEVICE)
    out = rotary_store_kv(
        x.qkv, x.positions, x.cos_sin, x.kv_cache, x.slots, hq, hkv, head_dim, q_out=q_out
    )
    assert out.data_ptr() == q_out.data_ptr()
    assert torch.equal(out, q.view_as(out))
    assert torch.equal(x.kv_cache, unfused_cache)


def qk_norm_weights(head_dim: int, dtype: torch.dtype) -> QKNorm:
    return QKNorm(
        randn(head_dim, dtype=dtype, seed=7) * 0.5 + 1, randn(head_dim, dtype=dtype, seed=8), 1e-6
    )


EXACT_FP8 = pytest.mark.skipif(INTERPRETED, reason="the interpreter's e4m3 rounding")


@pytest.mark.parametrize(
    "fp8_cache", [False, pytest.param(True, marks=EXACT_FP8)], ids=["cache-dtype", "fp8-cache"]
)
@pytest.mark.parametrize("rotary_fraction", [1, 2], ids=["full-rotary", "half-rotary"])
@pytest.mark.parametrize("qk_norm", [False, True], ids=["no-norm", "qk-norm"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_store_kv_with_qk_norm_and_partial_rotary_matches_reference(
    dtype: torch.dtype, qk_norm: bool, rotary_fraction: int, fp8_cache: bool
) -> None:
    """Qwen3's per-head q/k RMSNorm and GLM-4.5's partial rotary (the dims past the rotary
    ones pass through) in the fused kernel, against norm, rotate and store in torch."""
    head_dim, hq, hkv, page, tokens = 128, 16, 4, 16, 45
    x = fused_inputs(head_dim, hq, hkv, page, tokens, dtype, row_pad=64)
    cos_sin = cos_sin_cache(4096, head_dim // rotary_fraction)
    norm = qk_norm_weights(head_dim, dtype) if qk_norm else None
    cache, scales = x.kv_cache, None
    if fp8_cache:
        cache = x.kv_cache.float().to(torch.float8_e4m3fn)
        scales = (torch.tensor([0.05], device=DEVICE), torch.tensor([0.02], device=DEVICE))
    expected = cache.clone()
    args = (x.qkv, x.positions, cos_sin)
    ref_q = rotary_store_kv_reference(*args, expected, x.slots, hq, hkv, head_dim, scales, norm)
    q = rotary_store_kv(*args, cache, x.slots, hq, hkv, head_dim, None, scales, norm)
    torch.testing.assert_close(q, ref_q, atol=TOL[dtype], rtol=TOL[dtype])
    if fp8_cache:  # one e4m3 step apart at most, where the norm's roundings differ
        diff = (cache.float() - expected.float()).abs()
        assert (diff <= expected.float().abs() * 2**-3 + 2**-9).all()
    else:
        torch.testing.assert_close(cache, expected, atol=TOL[dtype], rtol=TOL[dtype])
    if rotary_fraction > 1 and not qk_norm:  # the pass-through dims are copied as they are
        tail = x.qkv.view(tokens, -1, head_dim)[:, :hq, head_dim // rotary_fraction :]
        assert torch.equal(q[..., head_dim // rotary_fraction :], tail)


@pytest.mark.parametrize("dtype", [BF16_UNLESS_INTERPRETED, torch.float32])
def test_rotary_store_kv_with_qk_norm_matches_unfused_kernels(dtype: torch.dtype) -> None:
    """The fused q/k norm against the RMSNorm, rotary and store kernels the decoder ran before:
    the same roundings, the squares summed in another order (at most one rounding apart)."""
    head_dim, hq, hkv, page, tokens = 128, 32, 4, 16, 33
    x = fused_inputs(head_dim, hq, hkv, page, tokens, dtype, row_pad=0)
    norm = qk_norm_weights(head_dim, dtype)
    unfused_cache = x.kv_cache.clone()
    q, k, v = x.qkv.split([hq * head_dim, hkv * head_dim, hkv * head_dim], dim=-1)
    q = rms_norm(q.reshape(-1, head_dim), norm.q_weight, norm.eps).view(tokens, -1)
    k = rms_norm(k.reshape(-1, head_dim), norm.k_weight, norm.eps).view(tokens, -1)
    q, k = apply_rotary(q, k, x.positions, x.cos_sin, head_dim)
    kv_heads = (tokens, hkv, head_dim)
    store_kv_cache(k.view(kv_heads), v.contiguous().view(kv_heads), unfused_cache, x.slots)
    out = rotary_store_kv(
        x.qkv, x.positions, x.cos_sin, x.kv_cache, x.slots, hq, hkv, head_dim, qk_norm=norm
    )
    torch.testing.assert_close(out, q.view_as(out), atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(x.kv_cache, unfused_cache, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "inter"), [(1, 11), (17, 1024), (64, 14336)])
def test_silu_and_mul(rows: int, inter: int, dtype: torch.dtype) -> None:
    x = randn(rows, 2 * inter, dtype=dtype) * 2
    out = silu_and_mul(x)
    ref = silu_and_mul_reference(x)
    torch.testing.assert_close(out, ref, atol=TOL[dtype], rtol=TOL[dtype])
