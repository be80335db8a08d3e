"""Which quantization a checkpoint uses, and how (or whether) a GPU generation runs it.

Everything here reads ``kvserve.quant.registry``, the list the engine itself uses: a scheme
preflight passes is one the engine loads, and the path named for a compute capability is the
one the engine takes there. GGUF block types are dequantized on load and run unquantized.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvserve.quant.registry import (
    SCHEMES,
    UnsupportedQuantization,
    gpu_path,
    resolve,
    supported_summary,
)


@dataclass(frozen=True)
class QuantScheme:
    name: str  # "bf16", "fp8", "gguf:MOSTLY_Q4_1", ... (what a user reads)
    source: str  # where it was read: "config.json quant_method=modelopt", "--quantization", ...
    scheme: str  # the registry's key: "none", "fp8", ...


class UnknownQuantization(ValueError):
    """A quantization kvserve does not run; the message names it."""


def supported() -> str:
    return supported_summary()


def recognise(
    quantization_config: dict[str, Any] | None,
    gguf_file_type: str | None = None,
    override: str | None = None,
) -> QuantScheme:
    """The scheme a model would run with. Raises ``UnknownQuantization`` for others."""
    if override == "gguf" or (gguf_file_type is not None and override in (None, "auto")):
        source = "--quantization" if override == "gguf" else "GGUF general.file_type"
        return QuantScheme(f"gguf:{gguf_file_type or '?'}", source, "none")
    try:
        config = resolve(quantization_config, override)
    except UnsupportedQuantization as exc:
        raise UnknownQuantization(str(exc)) from exc
    name = "bf16" if config.scheme == "none" else config.scheme
    return QuantScheme(name, config.source, config.scheme)


def execution_path(scheme: QuantScheme, cc: tuple[int, int]) -> str | None:
    """How ``scheme`` runs on compute capability ``cc``; None when it cannot run there."""
    path, not_yet = gpu_path(scheme.scheme, cc)
    if path is None:
        return None
    if not_yet is not None and cc >= not_yet.min_cc:
        return f"{path.description} ({not_yet.description} on this GPU: not supported yet)"
    return path.description


def paths_on(cc: tuple[int, int]) -> str:
    """Every scheme the engine runs and its path on ``cc``, for a report line."""
    rows = []
    for name in SCHEMES:
        path = execution_path(QuantScheme(name, "", name), cc)
        rows.append(f"{name}: {path or 'cannot run'}")
    return "; ".join(rows)


def scheme_for(
    quantization_config: dict[str, Any] | None, gguf_file_type: str | None, override: str | None
) -> QuantScheme | str:
    """``recognise`` for checks: the scheme, or the reason it is not one kvserve runs."""
    try:
        return recognise(quantization_config, gguf_file_type, override)
    except UnknownQuantization as exc:
        return str(exc)
