"""From a model path to (config, weights, tokenizer): HF directories and GGUF files."""

from __future__ import annotations

from kvserve.loader.bundled import bundled_model_path
from kvserve.loader.generation_defaults import GenerationDefaults
from kvserve.loader.model_source import ModelSource, open_model_source
from kvserve.loader.tokenizer import Tokenizer, load_tokenizer

__all__ = [
    "GenerationDefaults",
    "ModelSource",
    "Tokenizer",
    "bundled_model_path",
    "load_tokenizer",
    "open_model_source",
]
