"""MXFP4 unpacking and scales against three independent implementations: compressed-tensors'
MXFP4 compressor (mxfp4-pack-quantized), torchao's ``MXTensor`` (OCP MX) and transformers'
gpt-oss dequantizer (``convert_moe_packed_tensors``, the *_blocks/*_scales layout)."""

from __future__ import annotations

import pytest
import torch

from kvserve.kernels.fp4_reference import dequantize_fp4
from kvserve.quant.mxfp4 import quantize_mxfp4

pytest.importorskip("compressed_tensors")


def weight(n: int = 64, k: int = 256, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * 0.02
    w[2, :32] = 0.0  # an all-zero block
    w[7, 64:96] *= 300  # a block with a large exponent
    return w


def test_our_quantization_decompresses_the_same_in_compressed_tensors() -> None:
    from compressed_tensors.compressors.mxfp4.base import MXFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme

    q = quantize_mxfp4(weight())
    scheme = preset_name_to_scheme("MXFP4A16", ["Linear"])
    state = {"weight_packed": q.packed, "weight_scale": q.block_scale}
    theirs = MXFP4PackedCompressor.decompress(state, scheme)["weight"].float()
    assert torch.equal(dequantize_fp4(*q), theirs)  # powers of two times E2M1: exact in bf16


def test_torchao_mx_tensors_dequantize_the_same() -> None:
    """torchao packs its own quantization; we read its bytes and scales as they are."""
    from torchao.prototype.mx_formats.mx_tensor import MXTensor

    w = weight()
    mx = MXTensor.to_mx(w, torch.float4_e2m1fn_x2, 32)
    packed = mx.qdata.view(torch.uint8).reshape(64, 128)
    scales = mx.scale.view(torch.uint8).reshape(64, 8)
    assert torch.equal(dequantize_fp4(packed, scales), mx.dequantize(torch.float32))


def test_torchao_and_we_quantize_alike() -> None:
    """Both take the OCP scale 2**(floor(log2(amax)) - 2); codes agree but for rare ties."""
    from torchao.prototype.mx_formats.mx_tensor import MXTensor

    w = weight()
    mx = MXTensor.to_mx(w, torch.float4_e2m1fn_x2, 32)
    q = quantize_mxfp4(w)
    assert torch.equal(
        q.block_scale[torch.arange(64) != 2],
        mx.scale.view(torch.uint8).reshape(64, 8)[torch.arange(64) != 2],
    )
    assert (q.packed != mx.qdata.view(torch.uint8).reshape(64, 128)).float().mean() < 1e-3


def test_gptoss_blocks_dequantize_the_same_in_transformers() -> None:
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    q = quantize_mxfp4(weight())
    blocks = q.packed.reshape(64, 8, 16)  # gpt-oss: [rows, K/32, 16 bytes]
    theirs = convert_moe_packed_tensors(blocks[None], q.block_scale[None], dtype=torch.float32)
    assert torch.equal(dequantize_fp4(*q), theirs[0].T)  # it returns [experts, K, rows]


def test_zero_block_and_large_exponents() -> None:
    q = quantize_mxfp4(weight())
    back = dequantize_fp4(*q)
    assert back[2, :32].abs().max() == 0
    w = weight()
    assert (back - w).norm() / w.norm() < 0.2  # E2M1 with power-of-two scales: ~13% on Gaussians
