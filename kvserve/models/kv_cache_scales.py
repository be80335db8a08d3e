"""Per-layer FP8 KV cache scales as checkpoints store them.

Names seen in the field (the scale multiplies a stored FP8 value back to the real one):
    model.layers.N.self_attn.k_scale / v_scale              (compressed-tensors, vLLM)
    model.layers.N.self_attn.k_proj.k_scale / v_proj.v_scale (ModelOpt)
    model.layers.N.self_attn.kv_scale                        (older: one scale for both)
    model.layers.N.self_attn.k_proj.output_scale / v_proj.output_scale (older compressed-tensors)
"""

from __future__ import annotations

import re

import torch

from kvserve.errors import ModelLoadError

_LAYER = re.compile(r"\.layers\.(\d+)\.self_attn\.(.+)$")
_WHICH = {
    "k_scale": "k",
    "k_proj.k_scale": "k",
    "k_proj.output_scale": "k",
    "v_scale": "v",
    "v_proj.v_scale": "v",
    "v_proj.output_scale": "v",
    "kv_scale": "kv",
}


def kv_scale_target(name: str) -> tuple[int, str] | None:
    """(layer, "k" | "v" | "kv") of a KV cache scale's checkpoint name; None for any other."""
    match = _LAYER.search(name)
    if match is None or match.group(2) not in _WHICH:
        return None
    return int(match.group(1)), _WHICH[match.group(2)]


class KVCacheScales:
    """The k/v scales a checkpoint carries, by layer (absent ones are 1.0)."""

    def __init__(self) -> None:
        self.by_layer: dict[int, list[float]] = {}

    def add(self, name: str, tensor: torch.Tensor) -> bool:
        """Record ``tensor`` when ``name`` is a KV cache scale; False for any other tensor."""
        target = kv_scale_target(name)
        if target is None:
            return False
        if tensor.numel() != 1:
            raise ModelLoadError(
                f"checkpoint weight {name!r}: a per-tensor KV cache scale must hold one value, "
                f"got shape {tuple(tensor.shape)} (per-head KV scales are not supported)"
            )
        value = float(tensor.float().item())
        if not value > 0.0 or value == float("inf"):
            raise ModelLoadError(f"checkpoint weight {name!r}: KV cache scale {value} is not > 0")
        layer, which = target
        scales = self.by_layer.setdefault(layer, [1.0, 1.0])
        for i, key in enumerate("kv"):
            if key in which:
                scales[i] = value
        return True
