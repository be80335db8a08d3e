"""A lower bound on a text's token count from its UTF-8 length, without tokenizing it.

With a byte-level BPE (GPT-2's scheme, as Llama 3, Qwen, GLM, DeepSeek and SmolLM use) every
byte of the text lands in exactly one token, and a regular token covers one byte per character
of its vocabulary entry; an added (special) token covers its own UTF-8 bytes. So no token covers
more bytes than the longest entry, and a text of B bytes has at least ceil(B / longest) tokens.
A normalizer, or a pre-tokenizer that can drop characters (whitespace splitting), breaks the
argument: for those the bound is None and callers tokenize as before."""

from __future__ import annotations

import json
from typing import Any

# Pre-tokenizers that keep every byte (a Split must not remove its matches).
_KEEPS_BYTES = {"ByteLevel", "Digits", "Split", "Punctuation"}


def max_bytes_per_token(hf: Any) -> int | None:
    """The most source bytes one token of this (fast) tokenizer can cover, or None when that
    cannot be read off its vocabulary."""
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None:
        return None
    spec = json.loads(backend.to_str())
    if spec.get("normalizer") is not None or (spec.get("model") or {}).get("type") != "BPE":
        return None
    if not _byte_level(spec.get("pre_tokenizer")):
        return None
    added = {t["content"] for t in spec.get("added_tokens", [])}
    regular = max((len(t) for t in spec["model"]["vocab"] if t not in added), default=0)
    return max([regular, *(len(t.encode()) for t in added)]) or None


def _byte_level(pre: dict | None) -> bool:
    steps = (pre or {}).get("pretokenizers", [pre]) if pre else []
    types = [s.get("type") for s in steps]
    removes = any(s.get("behavior") == "Removed" for s in steps)
    return "ByteLevel" in types and not removes and all(t in _KEEPS_BYTES for t in types)


def min_tokens(nbytes: int, longest: int) -> int:
    return -(-nbytes // longest)
