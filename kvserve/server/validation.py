"""Request checks the API process makes before anything reaches the engine, against the
limits the engine announced in its ``Ready`` message (the engine's own checks, as 400s)."""

from __future__ import annotations

from kvserve.engine.core.prompt_checks import check_prompt as engine_check_prompt
from kvserve.engine.core.sampling_params import SamplingParams
from kvserve.engine.ipc.messages import Ready
from kvserve.errors import InvalidRequestError
from kvserve.loader.token_bound import min_tokens
from kvserve.loader.tokenizer import Tokenizer
from kvserve.server.errors import APIError


def check_prompt(ids: list[int], params: SamplingParams, ready: Ready) -> None:
    try:
        engine_check_prompt(ids, params, ready.context_length, ready.vocab_size)
    except InvalidRequestError as exc:
        raise APIError.from_invalid(exc) from None


def refuse_text_that_cannot_fit(tok: Tokenizer, text: str, ready: Ready, param: str) -> None:
    """A text whose byte length alone proves it longer than the context is refused before it
    is tokenized (an 8 MB prompt would take ~0.5 GB and seconds of CPU to count)."""
    if 4 * len(text) <= ready.context_length:
        return  # at most 4 UTF-8 bytes a character: no bound can pass the context
    longest = tok.max_bytes_per_token  # read off the vocabulary (0.1 s) on the first long prompt
    if longest is None or 4 * len(text) <= longest * ready.context_length:
        return
    nbytes = len(text.encode())
    least = min_tokens(nbytes, longest)
    if least > ready.context_length:
        raise APIError(400, f"the prompt has at least {least} tokens ({nbytes} bytes, at most "
                       f"{longest} per token), more than the context length of "
                       f"{ready.context_length}", param)  # fmt: skip
