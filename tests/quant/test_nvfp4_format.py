"""NVFP4 packing, scales and quantization against compressed-tensors' NVFP4 compressor, an
independent implementation (its unpack, its dequantize, its own quantize-and-pack)."""

from __future__ import annotations

import pytest
import torch

from kvserve.kernels.fp4_reference import E2M1_VALUES, dequantize_fp4, unpack_e2m1
from kvserve.quant.fp4_common import encode_e2m1, pack_e2m1
from kvserve.quant.nvfp4 import quantize_nvfp4

ct_nvfp4 = pytest.importorskip("compressed_tensors.compressors.nvfp4.helpers")


def weight(n: int = 96, k: int = 256, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * 0.05
    w[3, :16] = 0.0  # an all-zero block
    w[5, 40] = 1.5  # an outlier that sets the per-tensor scale
    return w


def test_encode_rounds_to_nearest_even_and_saturates() -> None:
    values = torch.tensor([0.2, 0.25, 0.3, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.1, 7.0, -0.0, -2.9])
    expected = [0.0, 0.0, 0.5, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, -0.0, -3.0]
    decoded = torch.tensor(E2M1_VALUES)[encode_e2m1(values).long()]
    assert decoded.tolist() == expected
    assert torch.equal(torch.signbit(decoded), torch.signbit(torch.tensor(expected)))


def test_every_code_round_trips() -> None:
    codes = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(encode_e2m1(torch.tensor(E2M1_VALUES)), codes)


def test_unpack_matches_compressed_tensors() -> None:
    packed = torch.arange(256, dtype=torch.uint8).reshape(8, 32)
    theirs = ct_nvfp4.unpack_fp4_from_uint8(packed, 8, 64, dtype=torch.float32)
    assert torch.equal(unpack_e2m1(packed), theirs)
    assert torch.equal(pack_e2m1(encode_e2m1(theirs)), packed)


def test_our_quantization_decompresses_the_same_in_compressed_tensors() -> None:
    """compressed-tensors stores the per-tensor scale as its reciprocal (weight_global_scale)
    and dequantizes in bf16 (hence a bf16 tolerance)."""
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme

    q = quantize_nvfp4(weight())
    scheme = preset_name_to_scheme("NVFP4A16", ["Linear"])
    state = {
        "weight_packed": q.packed,
        "weight_scale": q.block_scale,
        "weight_global_scale": (1.0 / q.row_scale[:1]).float(),
    }
    theirs = NVFP4PackedCompressor.decompress(state, scheme)["weight"].float()
    torch.testing.assert_close(dequantize_fp4(*q), theirs, rtol=2**-7, atol=0)


def test_compressed_tensors_packs_our_scales_into_our_codes() -> None:
    """Given the same scales, their quantize-and-pack gives our bytes (ties aside)."""
    w = weight()
    q = quantize_nvfp4(w)
    global_scale = (1.0 / q.row_scale[:1]).float()
    theirs = ct_nvfp4.quantize_and_pack_fp4(w, q.block_scale.float(), global_scale, group_size=16)
    assert (theirs != q.packed).float().mean() < 1e-3


def test_quantization_error_is_small_and_scales_are_modelopt_like() -> None:
    w = weight()
    q = quantize_nvfp4(w)
    assert q.packed.dtype == torch.uint8 and q.packed.shape == (96, 128)
    assert q.block_scale.dtype == torch.float8_e4m3fn and q.block_scale.shape == (96, 16)
    assert torch.allclose(q.row_scale, torch.full((96,), 1.5 / (6 * 448)))
    back = dequantize_fp4(*q)
    assert back[3, :16].abs().max() == 0
    assert (back - w).norm() / w.norm() < 0.12  # E2M1 with per-16 scales: ~8-10% on Gaussians
    assert abs(back[5, 40].item() - 1.5) < 1e-6  # the tensor's maximum maps to 6 * 448


def test_k_not_a_multiple_of_16_is_refused() -> None:
    with pytest.raises(ValueError, match="multiple of 16"):
        quantize_nvfp4(torch.randn(4, 40))
