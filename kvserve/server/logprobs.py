"""Engine logprobs -> the two OpenAI shapes (legacy completions, chat)."""

from __future__ import annotations

from typing import Any

from kvserve.engine.core.outputs import TokenLogprobs
from kvserve.loader import Tokenizer


def _token(tok: Tokenizer, token_id: int) -> str:
    return tok.decode([token_id], skip_special_tokens=False)


def completion_logprobs(
    tok: Tokenizer, lps: list[TokenLogprobs], text_offset: int
) -> dict[str, Any]:
    tokens = [_token(tok, lp.token_id) for lp in lps]
    offsets, at = [], text_offset
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": [lp.logprob for lp in lps],
        "top_logprobs": [{_token(tok, t): v for t, v in lp.top} for lp in lps],
        "text_offset": offsets,
    }


def chat_logprobs(tok: Tokenizer, lps: list[TokenLogprobs]) -> dict[str, Any]:
    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        text = _token(tok, token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {
        "content": [
            {**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
            for lp in lps
        ]
    }
