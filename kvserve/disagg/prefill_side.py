"""The prefill engine's side: when a step samples a request's first token, copy the prompt's
KV pages to host memory and hold them for the decode engine (the bootstrap server), before the
scheduler finishes the request (max_tokens 1) and its pages return to the radix cache."""

from __future__ import annotations

import logging
import time

from kvserve.config import DisaggConfig
from kvserve.disagg.blob import KVHeader, PrefilledKV
from kvserve.disagg.bootstrap import BootstrapServer
from kvserve.disagg.hooks import EngineHook
from kvserve.disagg.staging import copies_done_event, staging_for_pool
from kvserve.disagg.store import HeldKV
from kvserve.disagg.transfer import make_transport
from kvserve.engine.core.outputs import TokenLogprobs
from kvserve.engine.core.request import Request
from kvserve.engine.core.scheduler_output import SchedulerOutput
from kvserve.engine.runner.kv_pool import KVPool

log = logging.getLogger("kvserve.disagg")


class PrefillSide(EngineHook):
    mode = "prefill"

    def __init__(self, config: DisaggConfig, pool: KVPool, context_length: int) -> None:
        self.pool = pool
        self.staging = staging_for_pool(config.disaggregation_staging_gb, pool, context_length)
        self.held = HeldKV(config.disaggregation_transfer_timeout)
        self.transport = make_transport(config.disaggregation_transfer_backend)
        self.server = BootstrapServer(
            config.disaggregation_bootstrap_host, config.disaggregation_bootstrap_port,
            self.held, self.transport, config.disaggregation_transfer_timeout,
        )  # fmt: skip

    def before_update(self, plan: SchedulerOutput, sampled: dict[str, int],
                      logprobs: dict[str, TokenLogprobs]) -> None:  # fmt: skip
        for chunk in plan.chunks:
            req = chunk.request
            if chunk.sample and not req.is_finished and req.num_output_tokens == 0:
                rid = req.request_id
                self.server.put(self.capture(req, sampled[rid], logprobs.get(rid)))

    def capture(self, req: Request, first: int, logprob: TokenLogprobs | None) -> PrefilledKV:
        """Queue the copy of the prompt's pages into a staging buffer. On CUDA the engine thread
        does not wait for it: later kernels that reuse the pages run after it on the same
        stream, and the bootstrap thread waits for the event before it sends."""
        started = time.perf_counter()
        n = self.pool.pages_for(req.num_prompt_tokens)
        nbytes = self.pool.export_nbytes(n)
        staged = self.staging.take(nbytes)
        out = staged.data.view(self.pool.dtype).view(self.pool.export_shape(n))
        pages = self.pool.export_pages(req.block_table[:n], out=out)
        ready = copies_done_event(self.pool.device)
        header = KVHeader(
            room=req.request_id, prompt_token_ids=req.prompt_token_ids, first_token_id=first,
            first_logprob=logprob, num_cached_tokens=req.num_cached_tokens,
            dtype=str(pages.dtype).removeprefix("torch."), shape=list(pages.shape),
            k_scales=self.pool.k_scales.tolist(), v_scales=self.pool.v_scales.tolist(),
            nbytes=nbytes,
        )  # fmt: skip
        blob = PrefilledKV(header, pages, staged, ready)
        blob.seconds["capture"] = time.perf_counter() - started
        return blob

    def close(self) -> None:
        self.server.close()
