"""Mixtral's checkpoint names -> the decoder's: ``block_sparse_moe`` is ``mlp``, and an expert's
``w1`` / ``w3`` / ``w2`` are its ``gate_proj`` / ``up_proj`` / ``down_proj``. For its tensors and
for the layers a quantization config leaves unquantized."""

from __future__ import annotations

import re
from typing import Any

_MOE_BLOCK = re.compile(r"\bblock_sparse_moe\b")
_EXPERT_PROJ = re.compile(r"(\bexperts\.[^.]+)\.w([123])\b")
_PROJ = {"1": "gate_proj", "2": "down_proj", "3": "up_proj"}
# where the quantization configs kvserve reads list the layers they leave out
_IGNORE_KEYS = ("ignore", "exclude_modules", "modules_to_not_convert", "ignored_layers")


def decoder_name(name: str) -> str:
    """A Mixtral tensor or layer name (an ignore pattern too) as the decoder spells it."""
    name = _MOE_BLOCK.sub("mlp", name)
    return _EXPERT_PROJ.sub(lambda m: f"{m.group(1)}.{_PROJ[m.group(2)]}", name)


def decoder_quantization(qc: dict[str, Any] | None) -> dict[str, Any] | None:
    """``quantization_config`` with the layers it leaves out named as the decoder names them
    (ModelOpt keeps them one level down, under ``quantization``)."""
    if qc is None:
        return None
    out = {k: _renamed(k, v) for k, v in qc.items()}
    if isinstance(out.get("quantization"), dict):
        out["quantization"] = {k: _renamed(k, v) for k, v in out["quantization"].items()}
    return out


def _renamed(key: str, value: Any) -> Any:
    if key in _IGNORE_KEYS and isinstance(value, (list, tuple)):
        return [decoder_name(v) if isinstance(v, str) else v for v in value]
    return value
