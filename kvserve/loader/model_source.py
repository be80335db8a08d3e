"""``open_model_source``: one object for a model's config, weights, tokenizer and defaults."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Literal

import torch

from kvserve.config import ModelConfig
from kvserve.errors import ModelLoadError
from kvserve.loader.bundled import bundled_model_path
from kvserve.loader.generation_defaults import GenerationDefaults, read_generation_defaults
from kvserve.loader.gguf_config import gguf_eos_token_ids, read_gguf_config
from kvserve.loader.gguf_index import open_gguf_index
from kvserve.loader.gguf_weights import iter_gguf_weights
from kvserve.loader.hf_config import read_hf_config
from kvserve.loader.safetensors_weights import (
    check_safetensors_headers,
    iter_safetensors_weights,
    safetensors_files,
)
from kvserve.loader.tokenizer import Tokenizer, load_tokenizer

ModelFormat = Literal["hf", "gguf"]


class ModelSource:
    """A model on disk. Config and defaults are read on open; the tokenizer loads on first use
    (seconds for a GGUF); ``weights()`` streams tensors each time it is called."""

    def __init__(
        self,
        path: str,
        format: ModelFormat,
        config: ModelConfig,
        generation_defaults: GenerationDefaults,
    ) -> None:
        self.path = path
        self.format = format
        self.config = config
        self.generation_defaults = generation_defaults

    @functools.cached_property
    def tokenizer(self) -> Tokenizer:
        return load_tokenizer(self.path)

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        if self.format == "gguf":
            return iter_gguf_weights(open_gguf_index(self.path), self.config, self.path)
        return iter_safetensors_weights(safetensors_files(Path(self.path)))

    def __repr__(self) -> str:
        return f"ModelSource({self.path!r}, format={self.format!r}, {self.config.architecture})"


def open_model_source(path: str | None, load_format: str = "auto") -> ModelSource:
    """Open an HF model directory or a GGUF file; None means the bundled SmolLM2 GGUF.
    ``load_format="dummy"`` needs only the directory's config.json (no weight files)."""
    resolved = Path(path if path is not None else bundled_model_path()).expanduser().resolve()
    if not resolved.exists():
        raise ModelLoadError(f"{resolved}: no such file or directory")
    if resolved.is_dir():
        return _open_hf_dir(resolved, need_weights=load_format != "dummy")
    if resolved.suffix == ".gguf":
        return _open_gguf(resolved)
    raise ModelLoadError(f"{resolved}: expected an HF model directory or a .gguf file")


def _open_hf_dir(directory: Path, need_weights: bool = True) -> ModelSource:
    config = read_hf_config(directory)
    if need_weights:
        check_safetensors_headers(safetensors_files(directory))  # fail now, not in weights()
    defaults = read_generation_defaults(directory)
    if not defaults.eos_token_ids:
        defaults = replace(defaults, eos_token_ids=config.eos_token_ids)
    return ModelSource(str(directory), "hf", config, defaults)


def _open_gguf(path: Path) -> ModelSource:
    reader = open_gguf_index(str(path))
    config = read_gguf_config(reader, str(path))
    defaults = GenerationDefaults(eos_token_ids=gguf_eos_token_ids(reader))
    return ModelSource(str(path), "gguf", config, defaults)
