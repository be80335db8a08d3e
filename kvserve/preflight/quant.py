"""Which quantization a checkpoint uses, and how (or whether) a GPU generation can run it.

kvserve runs bf16/fp16, FP8, NVFP4, MXFP4 and GGUF block types. FP8 tensor cores need compute
capability 8.9+, FP4 tensor cores 10.0+; below that, down to 8.0, the weights are dequantized to
bf16 inside the GEMM (the weight-only path).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SUPPORTED = ("none (bf16/fp16)", "fp8", "nvfp4", "mxfp4", "gguf")
WEIGHT_ONLY_MIN_CC = (8, 0)  # bf16 GEMMs


@dataclass(frozen=True)
class QuantScheme:
    name: str  # "bf16", "fp8", "nvfp4", "mxfp4", "gguf:MOSTLY_Q4_1"
    source: str  # where it was read: "config.json quant_method=modelopt", "--quantization", ...
    native_cc: tuple[int, int] | None  # None: always weight-only (GGUF block types)


class UnknownQuantization(ValueError):
    """A quantization kvserve does not run; the message names it."""


def _modelopt(qc: dict[str, Any]) -> str:
    algo = str(qc.get("quant_algo") or (qc.get("quantization") or {}).get("quant_algo") or "")
    names = {"FP8": "fp8", "NVFP4": "nvfp4", "MXFP4": "mxfp4"}
    if algo.upper() not in names:
        raise UnknownQuantization(f"ModelOpt quant_algo {algo or '(missing)'}")
    return names[algo.upper()]


def _compressed_tensors(qc: dict[str, Any]) -> str:
    fmt = str(qc.get("format") or "")
    by_format = {
        "float-quantized": "fp8",
        "naive-quantized": "fp8",
        "nvfp4-pack-quantized": "nvfp4",
        "mxfp4-pack-quantized": "mxfp4",
    }
    if fmt in by_format:
        weights = [g.get("weights") or {} for g in (qc.get("config_groups") or {}).values()]
        if fmt == "naive-quantized" and any(w.get("type") != "float" for w in weights):
            raise UnknownQuantization("compressed-tensors naive-quantized integer weights")
        return by_format[fmt]
    raise UnknownQuantization(f"compressed-tensors format {fmt or '(missing)'}")


_NATIVE = {"fp8": (8, 9), "nvfp4": (10, 0), "mxfp4": (10, 0), "bf16": (8, 0)}


def _by_method(method: str, qc: dict[str, Any]) -> str:
    if method == "modelopt" or method == "modelopt_fp4":
        return "nvfp4" if method == "modelopt_fp4" else _modelopt(qc)
    if method == "compressed-tensors":
        return _compressed_tensors(qc)
    if method in ("fp8", "nvfp4", "mxfp4"):
        return method
    raise UnknownQuantization(f"quant_method {method or '(missing)'}")


def recognise(
    quantization_config: dict[str, Any] | None,
    gguf_file_type: str | None = None,
    override: str | None = None,
) -> QuantScheme:
    """The scheme a model would run with. Raises ``UnknownQuantization`` for others."""
    if override and override not in ("auto", "none"):
        if override == "gguf":
            return QuantScheme(f"gguf:{gguf_file_type or '?'}", "--quantization", None)
        name = _by_method(override, quantization_config or {})
        return QuantScheme(name, f"--quantization {override}", _NATIVE[name])
    if gguf_file_type is not None:
        return QuantScheme(f"gguf:{gguf_file_type}", "GGUF general.file_type", None)
    if not quantization_config:
        return QuantScheme("bf16", "no quantization_config", _NATIVE["bf16"])
    method = str(quantization_config.get("quant_method") or "")
    name = _by_method(method, quantization_config)
    return QuantScheme(name, f"config.json quant_method={method}", _NATIVE[name])


def execution_path(scheme: QuantScheme, cc: tuple[int, int]) -> str | None:
    """How ``scheme`` runs on compute capability ``cc``; None when it cannot run there."""
    if cc < WEIGHT_ONLY_MIN_CC:
        return None
    if scheme.native_cc is not None and cc >= scheme.native_cc:
        return f"native {scheme.name} tensor cores"
    if scheme.name == "bf16":
        return "bf16 tensor cores"
    return f"weight-only {scheme.name}: dequantized to bf16 in the GEMM"


def scheme_for(
    quantization_config: dict[str, Any] | None, gguf_file_type: str | None, override: str | None
) -> QuantScheme | str:
    """``recognise`` for checks: the scheme, or the reason it is not one kvserve runs."""
    try:
        return recognise(quantization_config, gguf_file_type, override)
    except UnknownQuantization as exc:
        return f"{exc} is not supported (kvserve runs {', '.join(SUPPORTED)})"
