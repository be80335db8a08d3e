"""What the offline API returns for each prompt."""

from __future__ import annotations

from dataclasses import dataclass

from kvserve.engine.core.outputs import TokenLogprobs


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" | "length" | "abort"
    stop_reason: int | str | None  # stop token id or string; None for EOS or length
    logprobs: list[TokenLogprobs] | None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]  # n of them
    num_cached_tokens: int  # prompt tokens served from the prefix cache

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def completion_tokens(self) -> int:
        return sum(len(o.token_ids) for o in self.outputs)

    @property
    def cached_tokens(self) -> int:
        return self.num_cached_tokens
