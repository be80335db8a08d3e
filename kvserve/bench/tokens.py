"""The client's tokenizer: the target's own (exact counts) or a word-piece approximation.

With ``--tokenizer PATH`` (HF directory or GGUF file; ``bundled`` for the bundled model) prompts
are sized with the target's tokenizer, read by kvserve's loader. Without it an approximate
tokenizer sizes prompts, and every reported token count comes from the server's ``usage``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from kvserve.errors import ConfigError


class Tokenizer(Protocol):
    name: str
    exact: bool  # True: counts are the target's; False: approximate

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def render_chat(self, messages: list[dict]) -> str: ...


class ApproxTokenizer:
    """Pieces of at most four non-space characters (with their leading space): about one BPE
    token each on English text. Ids are assigned on first sight, so equal text gives equal ids."""

    exact = False
    name = "approximate counts (no --tokenizer)"
    _PIECE = re.compile(r"\s*[^\s]{1,4}|\s+")

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._pieces: list[str] = []

    def encode(self, text: str) -> list[int]:
        out = []
        for piece in self._PIECE.findall(text):
            idx = self._ids.get(piece)
            if idx is None:
                idx = self._ids[piece] = len(self._pieces)
                self._pieces.append(piece)
            out.append(idx)
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self._pieces[i] for i in ids)

    def render_chat(self, messages: list[dict]) -> str:
        parts = [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
        return "".join(parts) + "<|im_start|>assistant\n"


class TargetTokenizer:
    """The target model's tokenizer through kvserve's loader (HF directory or GGUF file)."""

    exact = True

    def __init__(self, path: str | None) -> None:
        from kvserve.loader.tokenizer import load_tokenizer

        self._tok = load_tokenizer(path)
        self.name = f"client tokenizer {Path(self._tok.path).name}"

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(ids)

    def render_chat(self, messages: list[dict]) -> str:
        return self._tok.apply_chat_template(messages, add_generation_prompt=True)


def load(spec: str | None) -> Tokenizer:
    """``None`` -> approximate; ``"bundled"`` -> the bundled model; else an HF dir or GGUF file."""
    if spec is None:
        return ApproxTokenizer()
    if spec != "bundled" and not Path(spec).expanduser().exists():
        raise ConfigError(f"--tokenizer: no such file or directory {spec!r}")
    return TargetTokenizer(None if spec == "bundled" else str(Path(spec).expanduser()))
