"""Rotary position embedding (rotate-half / NeoX layout, as HF Llama/Qwen) with the rope
scalings configs use: default, linear, llama3 and yarn.

The cache is ``[max_positions, head_dim]`` float32: cos in the first half of the columns and sin
in the second, each already multiplied by the scaling's attention factor.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from kvserve.errors import ConfigError
from kvserve.kernels.options import TORCH_REFERENCE, KernelOptions
from kvserve.kernels.rotary import apply_rotary_reference


def _llama3_inv_freq(inv_freq: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
    factor, low, high = s["factor"], s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old_len = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return torch.where(medium, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(
    dim: int, base: float, s: dict[str, Any], max_positions: int
) -> tuple[torch.Tensor, float]:
    original = s.get("original_max_position_embeddings") or max_positions
    factor = s.get("factor") or max_positions / original
    attention_factor = s.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all = s.get("mscale"), s.get("mscale_all_dim")
        if mscale and mscale_all:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extrapolation = 1 - ramp
    inv_freq = (1 / (factor * pos_freqs)) * (1 - extrapolation) + (1 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)


def rope_inv_freq(
    head_dim: int, base: float, scaling: dict[str, Any] | None, max_positions: int
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [head_dim/2] and the factor applied to cos/sin."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    kind = (scaling or {}).get("rope_type", "default")
    if kind == "default":
        return inv_freq, 1.0
    assert scaling is not None
    if kind == "linear":
        return inv_freq / scaling["factor"], 1.0
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, scaling), 1.0
    if kind == "yarn":
        return _yarn_inv_freq(head_dim, base, scaling, max_positions)
    raise ConfigError(
        f"rope scaling type {kind!r} is not supported (default, linear, llama3, yarn)"
    )


class RotaryEmbedding(nn.Module):
    def __init__(
        self,
        head_dim: int,
        max_positions: int,
        base: float,
        scaling: dict[str, Any] | None,
        kernels: KernelOptions = TORCH_REFERENCE,
    ) -> None:
        super().__init__()
        self.head_dim = head_dim
        inv_freq, attention_factor = rope_inv_freq(head_dim, base, scaling, max_positions)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1) * attention_factor
        self.register_buffer("cos_sin_cache", cache, persistent=False)
        self.kernels = kernels

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated (q, k); the Triton kernel rotates in place, the reference returns new tensors.
        Both compute in fp32."""
        if self.kernels.triton:
            from kvserve.kernels.rotary import apply_rotary

            cache, pdl = self.cos_sin_cache, self.kernels.pdl
            return apply_rotary(q, k, positions, cache, self.head_dim, pdl=pdl)
        return apply_rotary_reference(q, k, positions, self.cos_sin_cache, self.head_dim)
