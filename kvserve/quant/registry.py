"""The one list of quantization schemes kvserve runs, and the resolution of a checkpoint's
``quantization_config`` and the ``--quantization`` flag to one of them.

Torch-free on import (preflight and config validation read it); a scheme's linear method is
imported only when a model is built. A format plugs in with one ``QuantScheme`` entry in
``SCHEMES`` and, for pre-quantized checkpoints, a mapping in ``checkpoint_config``.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

from kvserve.errors import ConfigError

if TYPE_CHECKING:
    from kvserve.quant.method import LinearMethod
    from kvserve.quant.moe_method import ExpertMethod


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


def check_flag(value: str | None) -> None:
    """Validate ``--quantization`` on its own (the checkpoint is not known yet)."""
    from kvserve.quant.checkpoint_config import LAYOUT_NAMES

    if value in (None, "auto", *SCHEMES, *LAYOUT_NAMES):
        return
    raise UnsupportedQuantization(
        f"--quantization {value} is not supported; kvserve runs: {supported_summary()}"
    )


def resolve(quantization_config: Mapping[str, Any] | None, flag: str | None = None) -> QuantConfig:
    """The checkpoint's quantization, or the flag's online one for an unquantized checkpoint.
    A flag naming the checkpoint's own scheme or layout just confirms it."""
    from kvserve.quant.checkpoint_config import read_checkpoint_config

    check_flag(flag)
    found = read_checkpoint_config(quantization_config) if quantization_config else None
    if found is not None:
        if found.scheme not in SCHEMES:
            raise UnsupportedQuantization(
                f"{found.scheme} ({found.source}) is not supported yet; "
                f"kvserve runs: {supported_summary()}"
            )
        if flag in (
            None,
            "auto",
            found.scheme,
            found.layout,
            quantization_config.get("quant_method"),
        ):
            return _checked(found)
        raise UnsupportedQuantization(
            f"--quantization {flag}: the checkpoint is already quantized "
            f"({found.scheme}, {found.source}); drop the flag or pass a {flag} checkpoint"
        )
    if flag in (None, "auto", "none"):
        return UNQUANTIZED
    if flag not in online_schemes():
        raise UnsupportedQuantization(
            f"--quantization {flag} needs a {flag} checkpoint (this one is unquantized); "
            f"online quantization supports: {', '.join(online_schemes()) or 'none yet'}"
        )
    return _checked(QuantConfig(flag, "online", f"--quantization {flag} (quantized at load)"))


def _checked(config: QuantConfig) -> QuantConfig:
    check = scheme(config.scheme).check
    if check is not None:
        module, _, attr = check.partition(":")
        getattr(importlib.import_module(module), attr)(config)
    return config


def linear_method(config: QuantConfig, prefixes: list[str]) -> LinearMethod:
    """The method for one linear layer whose shards have checkpoint names ``prefixes``
    (``...q_proj``, ``...k_proj``, ``...v_proj`` for a merged qkv). All or none of them may be
    in the ignore list."""
    ignored = [config.ignores(p) for p in prefixes]
    if any(ignored) and not all(ignored):
        raise UnsupportedQuantization(
            f"{', '.join(prefixes)} are merged into one layer, but only some of them are "
            f"excluded from quantization ({config.source})"
        )
    target = SCHEMES["none"] if all(ignored) else scheme(config.scheme)
    module, _, attr = target.method.partition(":")
    return getattr(importlib.import_module(module), attr)(config)


def expert_method(config: QuantConfig, prefix: str) -> ExpertMethod:
    """The method for the experts of one mixture-of-experts layer whose checkpoint names are
    ``prefix.{e}.{proj}`` (an ignore pattern matching the first expert's gate covers all)."""
    ignored = config.ignores(prefix) or config.ignores(f"{prefix}.0.gate_proj")
    target = SCHEMES["none"] if ignored else scheme(config.scheme)
    if target.moe_method is None:
        raise UnsupportedQuantization(
            f"{config.scheme} ({config.source}) is not supported for mixture-of-experts layers"
        )
    module, _, attr = target.moe_method.partition(":")
    return getattr(importlib.import_module(module), attr)(config)


def gpu_path(name: str, cc: tuple[int, int]) -> tuple[GpuPath | None, GpuPath | None]:
    """(the path ``name`` takes on ``cc`` or None, a faster path at a higher cc or on this cc
    that kvserve does not take yet or None)."""
    paths = scheme(name).gpu_paths
    runnable = [p for p in paths if p.runs and p.min_cc <= cc]
    not_yet = [p for p in paths if not p.runs]
    return (runnable[-1] if runnable else None), (not_yet[-1] if not_yet else None)


def check_device(config: QuantConfig, device_type: str, cc: tuple[int, int] | None) -> None:
    """Refuse a scheme on a GPU without the instructions it needs (CPU runs every scheme's
    reference)."""
    if device_type != "cuda" or cc is None:
        return
    path, _ = gpu_path(config.scheme, cc)
    if path is None:
        need = scheme(config.scheme).gpu_paths[0]
        raise UnsupportedQuantization(
            f"{config.scheme} ({config.source}) needs compute capability "
            f"{need.min_cc[0]}.{need.min_cc[1]}+ ({need.description}); this GPU is "
            f"sm_{cc[0]}{cc[1]}: use an unquantized checkpoint or a newer GPU"
        )
