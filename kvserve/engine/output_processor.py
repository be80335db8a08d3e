"""Turns the engine core's token stream into text: incremental detokenization, stop strings
(also across token boundaries; the stop string itself is not returned), logprobs and counts.
Used in-process by the offline ``LLM`` and by the API server."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvserve.engine.core.outputs import EngineCoreOutput, TokenLogprobs
from kvserve.engine.core.sampling_params import SamplingParams
from kvserve.engine.detokenizer import IncrementalDetokenizer
from kvserve.loader import Tokenizer


@dataclass
class StreamState:
    """One output sequence as its caller sees it."""

    request_id: str
    params: SamplingParams
    detokenizer: IncrementalDetokenizer | None  # None: no tokenizer (dummy weights), no text
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    text: str = ""  # text so far, stop string cut off
    num_sent: int = 0  # characters of ``text`` already handed out as deltas
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, StreamState] = {}

    def add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        detok = (
            IncrementalDetokenizer(
                self.tokenizer, prompt_token_ids, skip_special_tokens=params.skip_special_tokens
            )
            if self.tokenizer is not None
            else None
        )
        self.states[request_id] = StreamState(request_id, params, detok)

    def process(self, out: EngineCoreOutput) -> tuple[StreamState, str | None]:
        """Apply one core output. Returns the state and, when a stop string ended the
        sequence here, that string (the caller must then stop the request in the core)."""
        st = self.states[out.request_id]
        st.num_prompt_tokens, st.num_cached_tokens = out.num_prompt_tokens, out.num_cached_tokens
        hit = None
        for i, token in enumerate(out.new_token_ids):
            st.token_ids.append(token)
            if out.new_logprobs is not None:
                st.logprobs.append(out.new_logprobs[i])
            piece = st.detokenizer.add(token) if st.detokenizer is not None else ""
            ends_here = out.finish_reason == "stop" and i == len(out.new_token_ids) - 1
            if ends_here and not st.params.include_stop_str_in_output:
                piece = ""  # the EOS / stop token's own text is not returned
            hit = self._append_text(st, piece)
            if hit is not None:
                st.finish_reason, st.stop_reason = "stop", hit
                break
        if hit is None and out.finish_reason is not None:
            st.finish_reason, st.stop_reason = out.finish_reason, out.stop_reason
            if st.detokenizer is not None:  # bytes held back for an unfinished character
                st.text += st.detokenizer.flush()
        if st.finished:
            self.states.pop(out.request_id, None)
        return st, hit

    def _append_text(self, st: StreamState, piece: str) -> str | None:
        stops = st.params.stop
        if not stops or not piece:
            st.text += piece
            return None
        longest = max(len(s) for s in stops)
        search_from = max(0, len(st.text) - longest + 1)
        st.text += piece
        best: tuple[int, str] | None = None
        for s in stops:
            at = st.text.find(s, search_from)
            if at >= 0 and (best is None or at < best[0]):
                best = (at, s)
        if best is None:
            return None
        at, s = best
        st.text = st.text[: at + len(s)] if st.params.include_stop_str_in_output else st.text[:at]
        return s

    def take_delta(self, st: StreamState) -> str:
        """New text for a streaming client. While running, the last characters that could
        still turn out to begin a stop string are held back."""
        end = len(st.text)
        if not st.finished and st.params.stop:
            end = max(st.num_sent, end - (max(len(s) for s in st.params.stop) - 1))
        delta = st.text[st.num_sent : end]
        st.num_sent = end
        return delta

    def abort(self, request_id: str) -> None:
        self.states.pop(request_id, None)
