"""The one request-state object: every counter the scheduler and runner need, nothing hidden
elsewhere. "Known" tokens are prompt + output; "computed" tokens have their KV in the cache (or
are being written by a launched step). "Pending" tokens are sampled by a launched step but not
yet back on the host (overlap scheduling keeps one step in flight). Each step gives a request
``num_tokens + num_pending - num_computed_tokens`` more tokens (within budgets)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from kvserve.engine.core.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS, a stop token or a stop string
    LENGTH = "length"  # max_tokens or the context length
    ABORT = "abort"


@dataclass(eq=False)  # identity: queues find and remove requests by object
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seed: int  # drives this request's sampling noise (see layers.sampler)
    arrival_time: float
    max_tokens: int  # resolved: params.max_tokens capped by the context length
    eos_token_ids: tuple[int, ...] = ()
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_pending: int = 0  # tokens sampled by launched steps, not yet appended to the output
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first admission
    block_table: list[int] = field(default_factory=list)
    # Prefix-cache progress: pages of block_table already in the radix tree, and the tree node
    # of the last of them (locked by this request, so it cannot be evicted while held).
    num_cached_pages: int = 0
    last_cached_node: object | None = None
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None  # the stop token id or string that ended it
    num_preemptions: int = 0
    admitted: bool = False
    first_scheduled_time: float | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_tokens_with_pending(self) -> int:
        return self.num_tokens + self.num_pending

    @property
    def ends_with_pending(self) -> bool:
        """The pending token is its last one (max_tokens): nothing more to compute."""
        return self.num_pending > 0 and self.num_output_tokens + self.num_pending >= self.max_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def token_ids(self, start: int, end: int) -> list[int]:
        """Known tokens ``[start, end)`` across prompt and output."""
        p = len(self.prompt_token_ids)
        if end <= p:
            return self.prompt_token_ids[start:end]
        if start >= p:
            return self.output_token_ids[start - p : end - p]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - p]

    def token_at(self, position: int) -> int:
        p = len(self.prompt_token_ids)
        if position < p:
            return self.prompt_token_ids[position]
        return self.output_token_ids[position - p]

    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids
