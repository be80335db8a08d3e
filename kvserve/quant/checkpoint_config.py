"""A checkpoint's ``quantization_config`` -> ``QuantConfig``: which scheme, in which layout.

Readers per ``quant_method``. They recognise layouts whose scheme kvserve may not run yet (the
registry refuses those by name); anything else is refused here, naming what was found.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kvserve.quant.schemes import QuantConfig, UnsupportedQuantization, supported_summary

# compressed-tensors `format` -> scheme
CT_FORMATS = {
    "float-quantized": "fp8",
    "naive-quantized": "fp8",  # only with float 8-bit weights (checked below)
    "nvfp4-pack-quantized": "nvfp4",
    "mxfp4-pack-quantized": "mxfp4",
}
# ModelOpt `quant_algo` -> scheme
MODELOPT_ALGOS = {"FP8": "fp8", "NVFP4": "nvfp4", "MXFP4": "mxfp4"}


def _refuse(found: str) -> UnsupportedQuantization:
    return UnsupportedQuantization(f"{found} is not supported; kvserve runs: {supported_summary()}")


def _compressed_tensors(qc: Mapping[str, Any]) -> QuantConfig:
    groups = [g for g in (qc.get("config_groups") or {}).values() if isinstance(g, dict)]
    formats = {str(g.get("format") or qc.get("format") or "") for g in groups} or {
        str(qc.get("format") or "")
    }
    if len(formats) != 1:
        raise _refuse(f"compressed-tensors with mixed formats {sorted(formats)}")
    fmt = formats.pop()
    if fmt not in CT_FORMATS:
        raise _refuse(f"compressed-tensors format {fmt or '(missing)'}")
    if len(groups) > 1:
        raise _refuse("compressed-tensors with several config_groups")
    group = groups[0] if groups else {}
    weights = dict(group.get("weights") or {})
    if fmt == "naive-quantized" and (weights.get("type"), weights.get("num_bits")) != ("float", 8):
        raise _refuse(f"compressed-tensors naive-quantized {weights.get('type')} weights")
    params = {
        "format": fmt,
        "weights": weights,
        "input_activations": dict(group.get("input_activations") or {}),
        "targets": tuple(group.get("targets") or ("Linear",)),
    }
    return QuantConfig(
        CT_FORMATS[fmt],
        "compressed-tensors",
        f"config.json quant_method=compressed-tensors format={fmt}",
        params,
        tuple(qc.get("ignore") or ()),
    )


def _modelopt(qc: Mapping[str, Any]) -> QuantConfig:
    inner = qc.get("quantization") if isinstance(qc.get("quantization"), dict) else qc
    algo = str(inner.get("quant_algo") or "").upper()
    if algo not in MODELOPT_ALGOS:
        raise _refuse(f"ModelOpt quant_algo {algo or '(missing)'}")
    ignore = inner.get("exclude_modules") or inner.get("ignore") or ()
    return QuantConfig(
        MODELOPT_ALGOS[algo],
        "modelopt",
        f"quant_method=modelopt quant_algo={algo}",
        dict(inner),
        tuple(ignore),
    )


def _native_fp8(qc: Mapping[str, Any]) -> QuantConfig:
    """``quant_method: fp8`` as the FP8 releases of Qwen3 and DeepSeek write it."""
    ignore = qc.get("modules_to_not_convert") or qc.get("ignored_layers") or ()
    return QuantConfig("fp8", "fp8", "config.json quant_method=fp8", dict(qc), tuple(ignore))


def _mxfp4(qc: Mapping[str, Any]) -> QuantConfig:
    ignore = qc.get("modules_to_not_convert") or ()
    return QuantConfig("mxfp4", "mxfp4", "config.json quant_method=mxfp4", dict(qc), tuple(ignore))


READERS: dict[str, Callable[[Mapping[str, Any]], QuantConfig]] = {
    "compressed-tensors": _compressed_tensors,
    "modelopt": _modelopt,
    "modelopt_fp4": _modelopt,
    "fp8": _native_fp8,
    "mxfp4": _mxfp4,
}
LAYOUT_NAMES = tuple(READERS)


def read_checkpoint_config(qc: Mapping[str, Any]) -> QuantConfig:
    method = str(qc.get("quant_method") or "")
    if not method and ("quant_algo" in qc or "quantization" in qc):
        method = "modelopt"  # hf_quant_config.json has no quant_method
    if method not in READERS:
        raise _refuse(f"quant_method {method or '(missing)'}")
    return READERS[method](qc)
