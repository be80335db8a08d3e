"""The one list of quantization schemes kvserve runs (``SCHEMES``) and the types that describe
them: what a scheme is, how it runs on a GPU, and the ``QuantConfig`` a model resolves to.

Torch-free and import-free within kvserve.quant, so that both the checkpoint readers
(``checkpoint_config``) and the resolution that uses them (``registry``) build on it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from kvserve.errors import ConfigError


class UnsupportedQuantization(ConfigError):
    """A quantization kvserve does not run; the message names it and what is supported."""


@dataclass(frozen=True)
class GpuPath:
    """How a scheme runs from compute capability ``min_cc`` up; ``runs`` False marks a
    hardware path kvserve knows of but does not take yet."""

    min_cc: tuple[int, int]
    description: str
    runs: bool = True


@dataclass(frozen=True)
class QuantScheme:
    name: str
    summary: str
    layouts: tuple[str, ...]  # checkpoint layouts read, for messages and the README
    method: str  # "module:function"; function(QuantConfig) -> LinearMethod
    gpu_paths: tuple[GpuPath, ...]  # ascending min_cc
    online: bool  # `--quantization NAME` quantizes an unquantized checkpoint at load
    # "module:function" called with the QuantConfig when it is resolved (torch-free): raises
    # UnsupportedQuantization for a variant of the scheme that kvserve does not run
    check: str | None = None
    # "module:function"; function(QuantConfig) -> ExpertMethod for mixture-of-experts layers,
    # None: experts in this scheme are refused
    moe_method: str | None = None


@dataclass(frozen=True)
class QuantConfig:
    """What one model runs: a scheme, the layout its tensors come in, and the layout's
    parameters (as read from the checkpoint; each scheme interprets its own)."""

    scheme: str
    layout: str  # "none", "online", "compressed-tensors", "modelopt", "fp8", ...
    source: str  # where it was read, for messages: "config.json quant_method=modelopt"
    params: Mapping[str, Any] = field(default_factory=dict)
    ignore: tuple[str, ...] = ()  # layer names (exact, glob or "re:" regex) left unquantized

    def ignores(self, prefix: str) -> bool:
        for pattern in self.ignore:
            if pattern.startswith("re:"):
                if re.match(pattern[3:], prefix):
                    return True
            # a module's name also covers the layers inside it (gpt-oss's
            # modules_to_not_convert names "model.layers.*.self_attn")
            elif fnmatchcase(prefix, pattern) or fnmatchcase(prefix, pattern + ".*"):
                return True
        return False


SCHEMES: dict[str, QuantScheme] = {
    "none": QuantScheme(
        name="none",
        summary="unquantized weights in the model dtype (bf16/fp16/fp32)",
        layouts=("HF safetensors", "GGUF (block types dequantized on load)"),
        method="kvserve.quant.unquantized:make_method",
        gpu_paths=(GpuPath((8, 0), "bf16 tensor cores"),),
        online=False,
        moe_method="kvserve.quant.moe_unquantized:make_expert_method",
    ),
    "fp8": QuantScheme(
        name="fp8",
        summary="FP8 e4m3 weights and activations",
        layouts=(
            "compressed-tensors float-quantized",
            "ModelOpt FP8",
            "quant_method fp8 (128x128 blocks: Qwen3-FP8, DeepSeek)",
            "online",
        ),
        method="kvserve.quant.fp8_method:make_method",
        gpu_paths=(
            GpuPath(
                (8, 9),
                "FP8 tensor cores (torch._scaled_mm; Triton block-scaled GEMM for 128x128 blocks)",
            ),
            GpuPath(
                (9, 0),
                "FP8 tensor cores (torch._scaled_mm; cuBLASLt's block-scaled GEMM for 128x128"
                " blocks, the Triton one where it does not fit; steps of up to 64 tokens on a"
                " Triton wgmma kernel, one token on a CUDA-core GEMV)",
            ),
        ),
        online=True,
        check="kvserve.quant.fp8_config:fp8_spec",
        moe_method="kvserve.quant.moe_fp8:make_expert_method",
    ),
    "nvfp4": QuantScheme(
        name="nvfp4",
        summary="E2M1 weights, e4m3 scale per 16 + fp32 per-tensor scale; weight-only on Hopper",
        layouts=("ModelOpt NVFP4", "compressed-tensors nvfp4-pack-quantized"),
        method="kvserve.quant.nvfp4:make_method",
        moe_method="kvserve.quant.moe_fp4:make_nvfp4_method",
        gpu_paths=(
            GpuPath((9, 0), "weight-only: FP4 dequantized inside a Triton GEMM, bf16 MMA"),
            GpuPath((10, 0), "native FP4 tensor cores", runs=False),
        ),
        online=True,
    ),
    "mxfp4": QuantScheme(
        name="mxfp4",
        summary="E2M1 weights, E8M0 scale per 32 (OCP MX); weight-only on Hopper",
        layouts=("gpt-oss *_blocks/*_scales", "compressed-tensors mxfp4-pack-quantized"),
        method="kvserve.quant.mxfp4:make_method",
        moe_method="kvserve.quant.moe_fp4:make_mxfp4_method",
        gpu_paths=(
            GpuPath((9, 0), "weight-only: FP4 dequantized inside a Triton GEMM, bf16 MMA"),
            GpuPath((10, 0), "native FP4 tensor cores", runs=False),
        ),
        online=True,
    ),
}

UNQUANTIZED = QuantConfig("none", "none", "no quantization_config")


def supported_summary() -> str:
    """One line naming every scheme and the layouts it reads."""
    return "; ".join(f"{s.name} ({', '.join(s.layouts)})" for s in SCHEMES.values())


def scheme(name: str) -> QuantScheme:
    if name not in SCHEMES:
        raise UnsupportedQuantization(
            f"quantization {name} is not supported; kvserve runs: {supported_summary()}"
        )
    return SCHEMES[name]


def online_schemes() -> tuple[str, ...]:
    return tuple(s.name for s in SCHEMES.values() if s.online)
