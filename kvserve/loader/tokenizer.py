"""The model's tokenizer and chat template, from an HF directory or a GGUF file's metadata."""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvserve.errors import ModelLoadError
from kvserve.loader import gguf_tokenizer_cache
from kvserve.loader.bundled import bundled_model_path
from kvserve.loader.chat_template import render_chat_template
from kvserve.loader.files import one_line
from kvserve.loader.generation_defaults import read_generation_defaults
from kvserve.loader.gguf_config import gguf_eos_token_ids
from kvserve.loader.gguf_reader import gguf_field, open_gguf
from kvserve.loader.token_bound import max_bytes_per_token


class Tokenizer:
    """A thin wrapper over a transformers fast tokenizer with the engine's conventions."""

    def __init__(
        self, hf: Any, chat_template: str | None, eos_token_ids: Sequence[int], path: str
    ) -> None:
        self.hf = hf
        self.chat_template = chat_template
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(eos_token_ids))
        self.bos_token_id: int | None = hf.bos_token_id
        self.vocab_size: int = len(hf)
        self.path = path

    @functools.cached_property
    def max_bytes_per_token(self) -> int | None:
        """The most bytes of text one token covers (None: no such bound for this tokenizer)."""
        return max_bytes_per_token(self.hf)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return list(self.hf.convert_ids_to_tokens(list(ids)))

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        if self.chat_template is None:
            raise ModelLoadError(f"{self.path}: the model has no chat template")
        return render_chat_template(
            self.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            special_tokens=dict(self.hf.special_tokens_map),
            **kwargs,
        )

    def __repr__(self) -> str:
        return f"Tokenizer({self.path!r}, vocab_size={self.vocab_size})"


def load_tokenizer(path: str | None) -> Tokenizer:
    """Load (once per process and file version) the tokenizer of a model directory or GGUF file."""
    resolved = Path(path if path is not None else bundled_model_path()).resolve()
    if not resolved.exists():
        raise ModelLoadError(f"{resolved}: no such file or directory")
    return _load_cached(str(resolved), resolved.stat().st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _load_cached(path: str, mtime_ns: int) -> Tokenizer:
    del mtime_ns  # only part of the cache key: a rewritten file is loaded again
    if os.path.isdir(path):
        return _load_hf_dir(path)
    if path.endswith(".gguf"):
        return _load_gguf(path)
    raise ModelLoadError(f"{path}: expected a model directory or a .gguf file")


def _load_hf_dir(path: str) -> Tokenizer:
    from transformers import AutoTokenizer

    try:
        hf = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # transformers raises many kinds for missing/broken files
        raise ModelLoadError(f"{path}: cannot load the tokenizer: {one_line(exc)}") from exc
    eos = list(read_generation_defaults(Path(path)).eos_token_ids)
    if hf.eos_token_id is not None:
        eos.append(hf.eos_token_id)
    return Tokenizer(hf, _hf_chat_template(hf, Path(path)), eos, path)


def _load_gguf(path: str) -> Tokenizer:
    entry = gguf_tokenizer_cache.entry_dir(path)
    cached = gguf_tokenizer_cache.read_entry(entry)
    if cached is not None:
        return Tokenizer(*cached, path)
    hf, template, eos = _convert_gguf(path)
    gguf_tokenizer_cache.write_entry(entry, hf, template, eos)
    return Tokenizer(hf, template, eos, path)


def _convert_gguf(path: str) -> tuple[Any, str | None, list[int]]:
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    reader = open_gguf(path)
    directory, filename = os.path.split(path)
    load = {"gguf_file": filename, "local_files_only": True}
    try:
        try:
            hf = AutoTokenizer.from_pretrained(directory, **load)
        except ValueError as exc:
            if "is not supported yet" not in str(exc):
                raise
            # transformers reads the model config first and knows fewer GGUF architectures
            # than kvserve (glm4moe); the vocabulary alone converts whatever the architecture
            hf = PreTrainedTokenizerFast.from_pretrained(directory, **load)
    except Exception as exc:
        raise ModelLoadError(f"{path}: cannot load the tokenizer: {one_line(exc)}") from exc
    eos = list(gguf_eos_token_ids(reader))
    return hf, gguf_field(reader, "tokenizer.chat_template", hf.chat_template), eos


def _hf_chat_template(hf: Any, directory: Path) -> str | None:
    template = hf.chat_template
    if isinstance(template, dict):  # several named templates: the "default" one is for chat
        template = template.get("default")
    if template is None and (directory / "chat_template.jinja").is_file():
        template = (directory / "chat_template.jinja").read_text()
    return template
