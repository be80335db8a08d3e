"""A step whose forward pass and sampling are enqueued on the device, and its results' way back
to the host: one non-blocking device->host copy per step, waited on only when the host needs
the tokens (with overlap scheduling, after the next step has been launched)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvserve.engine.core.outputs import TokenLogprobs
from kvserve.engine.core.request import Request
from kvserve.engine.core.scheduler_output import SchedulerOutput
from kvserve.layers.sampler import SamplerOutput


@dataclass
class LaunchedStep:
    plan: SchedulerOutput
    requests: list[Request]  # the requests that sample this step, in the sampler's row order
    token_ids: torch.Tensor | None  # int64 [S] on the device: feeds the next step's pending rows
    host: SamplerOutput | None  # the sampler's output, being copied to the host
    copied: torch.cuda.Event | None  # recorded after the copy (None on CPU: already there)

    @classmethod
    def start(
        cls, plan: SchedulerOutput, requests: list[Request], out: SamplerOutput
    ) -> LaunchedStep:
        if out.token_ids.device.type != "cuda":
            return cls(plan, requests, out.token_ids, out, None)

        def to_host(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to("cpu", non_blocking=True)

        host = SamplerOutput(
            to_host(out.token_ids), to_host(out.logprob), to_host(out.top_ids),
            to_host(out.top_logprobs),
        )  # fmt: skip
        event = torch.cuda.Event()
        event.record()
        return cls(plan, requests, out.token_ids, host, event)

    @classmethod
    def empty(cls, plan: SchedulerOutput) -> LaunchedStep:
        """A step with nothing to sample (every chunk a partial prefill)."""
        return cls(plan, [], None, None, None)

    def row_of(self) -> dict[str, int]:
        return {r.request_id: i for i, r in enumerate(self.requests)}

    def results(self) -> tuple[dict[str, int], dict[str, TokenLogprobs]]:
        """Waits for the copy; sampled token per request id and logprobs where asked."""
        if self.host is None:
            return {}, {}
        if self.copied is not None:
            self.copied.synchronize()
        return _by_request(self.requests, self.host)


def _by_request(
    requests: list[Request], out: SamplerOutput
) -> tuple[dict[str, int], dict[str, TokenLogprobs]]:
    token_ids = out.token_ids.tolist()
    sampled = {r.request_id: t for r, t in zip(requests, token_ids)}
    logprobs: dict[str, TokenLogprobs] = {}
    if out.logprob is None:
        return sampled, logprobs
    values = out.logprob.tolist()
    top_ids = out.top_ids.tolist() if out.top_ids is not None else None
    top_lps = out.top_logprobs.tolist() if out.top_logprobs is not None else None
    for i, r in enumerate(requests):
        n = r.params.logprobs
        if n is None:
            continue
        top = list(zip(top_ids[i][:n], top_lps[i][:n])) if n and top_ids and top_lps else []
        logprobs[r.request_id] = TokenLogprobs(token_ids[i], values[i], top)
    return sampled, logprobs
