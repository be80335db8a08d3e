"""The resolution of a checkpoint's ``quantization_config`` and the ``--quantization`` flag to
one of the schemes kvserve runs (``schemes.SCHEMES``), and the linear and expert methods a model
builds from it.

Torch-free on import (preflight and config validation read it); a scheme's linear method is
imported only when a model is built. A format plugs in with one ``QuantScheme`` entry in
``schemes.SCHEMES`` and, for pre-quantized checkpoints, a mapping in ``checkpoint_config``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kvserve.quant.checkpoint_config import LAYOUT_NAMES, read_checkpoint_config
from kvserve.quant.schemes import (
    SCHEMES,
    UNQUANTIZED,
    GpuPath,
    QuantConfig,
    QuantScheme,
    UnsupportedQuantization,
    online_schemes,
    scheme,
    supported_summary,
)

if TYPE_CHECKING:
    from kvserve.quant.method import LinearMethod
    from kvserve.quant.moe_method import ExpertMethod

__all__ = [
    "SCHEMES",
    "UNQUANTIZED",
    "GpuPath",
    "QuantConfig",
    "QuantScheme",
    "UnsupportedQuantization",
    "check_device",
    "check_flag",
    "expert_method",
    "gpu_path",
    "linear_method",
    "online_schemes",
    "resolve",
    "scheme",
    "supported_summary",
]


def check_flag(value: str | None) -> None:
    """Validate ``--quantization`` on its own (the checkpoint is not known yet)."""
    if value in (None, "auto", *SCHEMES, *LAYOUT_NAMES):
        return
    raise UnsupportedQuantization(
        f"--quantization {value} is not supported; kvserve runs: {supported_summary()}"
    )


def resolve(quantization_config: Mapping[str, Any] | None, flag: str | None = None) -> QuantConfig:
    """The checkpoint's quantization, or the flag's online one for an unquantized checkpoint.
    A flag naming the checkpoint's own scheme or layout just confirms it."""
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
    ``prefix.{e}.{proj}``."""
    target = SCHEMES["none"] if _experts_ignored(config, prefix) else scheme(config.scheme)
    if target.moe_method is None:
        raise UnsupportedQuantization(
            f"{config.scheme} ({config.source}) is not supported for mixture-of-experts layers"
        )
    module, _, attr = target.moe_method.partition(":")
    return getattr(importlib.import_module(module), attr)(config)


def same_expert_format(config: QuantConfig, experts_prefix: str, shared_prefix: str) -> bool:
    """Whether a shared expert's checkpoint tensors (``shared_prefix.{proj}``) are in the
    routed experts' format (``experts_prefix.{e}.{proj}``): both quantized by the scheme or
    both left out of it, so the experts' method reads them into the same stacks."""
    experts = _experts_ignored(config, experts_prefix)
    shared = [config.ignores(f"{shared_prefix}.{proj}") for proj in _EXPERT_PROJECTIONS]
    return all(ignored == experts for ignored in shared)


_EXPERT_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")  # moe_method.EXPERT_SHARDS' keys


def _experts_ignored(config: QuantConfig, prefix: str) -> bool:
    """An ignore pattern matching the experts' prefix or the first expert's gate covers all."""
    return config.ignores(prefix) or config.ignores(f"{prefix}.0.gate_proj")


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
