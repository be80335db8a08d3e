"""Incremental detokenization: turn a stream of token ids into a stream of finished text.

A byte-level BPE token can end inside a multi-byte UTF-8 character; decoding it alone yields a
trailing "\\ufffd". Such text is held back until a later token completes the character.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

# Prompt tokens kept as decoding context, so the first output token decodes as it would
# mid-text (e.g. keeps its leading space) rather than at the start of a string.
PROMPT_CONTEXT_TOKENS = 6
REPLACEMENT_CHAR = "\ufffd"


class Decoder(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Decodes only a short window of tokens per step:

    ids:  [ ... prompt context ... | out0 out1 ... | pending ... ]
                ^prefix_offset       ^read_offset
    text emitted for a step = decode(ids[prefix:]) minus decode(ids[prefix:read]).
    """

    def __init__(
        self,
        tokenizer: Decoder,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.output_token_ids: list[int] = []
        self.text = ""  # everything emitted so far
        self._ids = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def add(self, token_id: int) -> str:
        """Append one token; return the text it finalises ("" while a character is incomplete)."""
        self.output_token_ids.append(token_id)
        self._ids.append(token_id)
        new_text = self._pending_text()
        if new_text.endswith(REPLACEMENT_CHAR):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        self.text += new_text
        return new_text

    def flush(self) -> str:
        """At the end of a stream: the held-back text (with its replacement character), if any."""
        new_text = self._pending_text()
        self._prefix_offset = self._read_offset = len(self._ids)
        self.text += new_text
        return new_text

    def _pending_text(self) -> str:
        ids = self._ids
        decode = self.tokenizer.decode
        skip = self.skip_special_tokens
        prefix_text = decode(ids[self._prefix_offset : self._read_offset], skip_special_tokens=skip)
        full_text = decode(ids[self._prefix_offset :], skip_special_tokens=skip)
        # A longer window can decode shorter (skipped special tokens): nothing new then.
        return full_text[len(prefix_text) :] if len(full_text) > len(prefix_text) else ""
