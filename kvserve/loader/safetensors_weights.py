"""Weights of an HF checkpoint: one ``*.safetensors`` file or shards listed in an index."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from kvserve.errors import ModelLoadError
from kvserve.loader.files import one_line, read_json_object

INDEX_FILE = "model.safetensors.index.json"


def safetensors_files(directory: Path) -> list[Path]:
    """The checkpoint's files, in a stable order; raises if there are none or a shard is missing."""
    index = directory / INDEX_FILE
    if index.is_file():
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelLoadError(f"{index}: no `weight_map` entries")
        files = [directory / name for name in sorted(set(weight_map.values()))]
        for file in files:
            if not file.is_file():
                raise ModelLoadError(f"{index}: lists shard {file.name}, which is missing")
        return files
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{directory}: no *.safetensors weight files")
    return files


def check_safetensors_headers(files: list[Path]) -> None:
    """Read every file's header now, so a truncated or corrupt file fails on open."""
    for file in files:
        with _open(file):
            pass


def iter_safetensors_weights(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) in checkpoint dtype, one shard open at a time."""
    for file in files:
        with _open(file) as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                yield name, handle.get_tensor(name)


def _open(file: Path) -> Any:
    from safetensors import safe_open

    try:
        return safe_open(str(file), framework="pt")
    except Exception as exc:  # SafetensorError, OSError, ... on a bad file
        raise ModelLoadError(
            f"{file}: not a readable safetensors file (truncated or corrupt?): {one_line(exc)}"
        ) from exc
