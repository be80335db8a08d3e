"""From a model path to (config, weights, tokenizer): HF directories and GGUF files."""

from __future__ import annotations

from kvserve.loader.bundled import bundled_model_path
from kvserve.loader.tokenizer import Tokenizer, load_tokenizer

__all__ = ["Tokenizer", "bundled_model_path", "load_tokenizer"]
