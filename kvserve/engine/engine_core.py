"""The engine core: scheduler + model runner, one step at a time.

    plan = scheduler.schedule(); step = runner.launch(plan); scheduler.update(plan, step.results())

With overlap scheduling one step stays in flight: step N+1 is planned and launched before step
N's tokens are read back, so the host's bookkeeping runs while the GPU computes. Each ``step()``
then returns the outputs of the step before the one it launched.

It speaks token ids only (tokenizing, chat templates and detokenizing belong to its caller) and
is driven in-process by the offline ``LLM`` or from its own process by the server.
"""

from __future__ import annotations

import logging
import random
import time

import torch

from kvserve.config import EngineConfig, check_context_length
from kvserve.disagg.engine_hook import make_engine_hook
from kvserve.disagg.handle import RemotePrefill
from kvserve.distributed.parallel_state import SINGLE
from kvserve.distributed.rank0 import Rank0
from kvserve.engine.core.kv_cache_manager import KVCacheManager
from kvserve.engine.core.outputs import EngineCoreOutput
from kvserve.engine.core.prompt_checks import check_prompt
from kvserve.engine.core.request import Request
from kvserve.engine.core.sampling_params import SamplingParams
from kvserve.engine.core.scheduler import Scheduler
from kvserve.engine.core.stats import EngineStats
from kvserve.engine.runner.device import resolve_device, resolve_dtype
from kvserve.engine.runner.launched_step import LaunchedStep
from kvserve.engine.runner.model_runner import ModelRunner
from kvserve.env_settings import check_environment, settings_in_effect
from kvserve.errors import InvalidRequestError
from kvserve.loader import ModelSource, open_model_source

log = logging.getLogger("kvserve.engine")


class EngineCore:
    def __init__(self, config: EngineConfig, source: ModelSource | None = None) -> None:
        started = time.perf_counter()
        check_environment()  # a bad KVSERVE_* value fails the start, not the first step
        self.config = config
        self.source = source or open_model_source(config.model, config.load_format)
        mc = self.source.config
        self.model_config = mc
        self.device = resolve_device(config.device)
        if self.device.type == "cuda" and config.tp > 1:
            self.device = torch.device("cuda", 0)
        self.dtype = resolve_dtype(config.dtype, self.device)
        max_len = check_context_length(config.context_length, mc)
        weights = None if config.load_format == "dummy" else self.source.weights()
        # Tensor parallelism: this process is rank 0 and starts this host's other ranks.
        self.parallel = Rank0(config, mc, self.device) if config.tp > 1 else None
        try:
            tp = self.parallel.tp if self.parallel is not None else SINGLE
            self.runner = ModelRunner(config, mc, weights, self.device, self.dtype, max_len, tp)
        except BaseException:
            self.close()
            raise
        self.config = config = self.runner.config  # its running cap set from the pool
        kv_tokens = self.runner.num_pages * config.cache.page_size
        self.context_length = min(max_len, kv_tokens)
        self.kv = KVCacheManager(
            self.runner.num_pages, config.cache.page_size, config.cache.enable_prefix_cache
        )
        self.scheduler = Scheduler(config.scheduler, self.kv)
        self.requests: dict[str, Request] = {}
        self.eos_token_ids = self.source.generation_defaults.eos_token_ids or mc.eos_token_ids
        self._rng = random.Random(config.seed)
        overlap = config.overlap_schedule
        self.overlap = self.device.type == "cuda" if overlap is None else overlap
        self._in_flight: LaunchedStep | None = None
        self.disagg = make_engine_hook(config, self)  # None unless --disaggregation-mode
        self.startup_s = time.perf_counter() - started  # weights, KV pool, warm-up, graphs
        log.info(
            "engine ready in %.1f s (KV pool: %d tokens, up to %d running requests)",
            self.startup_s, kv_tokens, config.scheduler.max_running_requests,
        )  # fmt: skip
        if settings := settings_in_effect():
            log.info("settings from the environment: %s", settings)

    # -- requests ---------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
        remote: RemotePrefill | None = None,
    ) -> None:
        """``remote``: the prompt's KV comes from that prefill worker (decode mode)."""
        if request_id in self.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use")
        max_tokens = self.validate_prompt(prompt_token_ids, params)
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        request = Request(
            request_id=request_id,
            prompt_token_ids=list(prompt_token_ids),
            params=params,
            seed=seed,
            arrival_time=arrival_time if arrival_time is not None else time.monotonic(),
            max_tokens=max_tokens,
            eos_token_ids=tuple(self.eos_token_ids),
        )
        if remote is None:
            self.scheduler.add(request)
        elif self.disagg is None:
            raise InvalidRequestError("kv_transfer_params are only accepted by a decode worker")
        else:
            try:
                self.disagg.add(request, remote)
            except ValueError as exc:
                raise InvalidRequestError(str(exc)) from None
        self.requests[request_id] = request

    def validate_prompt(self, prompt_token_ids: list[int], params: SamplingParams) -> int:
        """Checks a prompt against the vocabulary and the context; returns the resolved
        max_tokens."""
        return check_prompt(
            prompt_token_ids, params, self.context_length, self.model_config.vocab_size
        )

    def abort_request(self, request_id: str) -> None:
        request = self.requests.pop(request_id, None)
        if request is not None and not (self.disagg and self.disagg.abort(request_id)):
            self.scheduler.abort(request)

    def stop_request(self, request_id: str, stop: str) -> None:
        """End a request whose text hit a stop string (found by the detokenizing caller)."""
        request = self.requests.pop(request_id, None)
        if request is not None:
            self.scheduler.finish_by_stop_string(request, stop)

    def has_unfinished(self) -> bool:
        held = self.disagg is not None and self.disagg.num_pending > 0
        return self._in_flight is not None or self.scheduler.has_unfinished() or held

    # -- the loop ---------------------------------------------------------------------------
    def step(self) -> list[EngineCoreOutput]:
        """Launch the next step; return the outputs of the step completed meanwhile."""
        if self.parallel is None:
            return self._step()
        self.parallel.check()
        try:
            return self._step()
        except Exception as exc:  # a failed collective: say which rank is gone, if one is
            self.parallel.check(exc)
            raise

    def check_health(self) -> None:
        """Raises ``RankFailed`` when a tensor-parallel worker has exited (checked when idle
        too, so a dead rank is noticed before the next request)."""
        if self.parallel is not None:
            self.parallel.check()

    def close(self) -> None:
        """Stop the tensor-parallel workers (nothing to do without them)."""
        if self.parallel is not None:
            self.parallel.close(getattr(self, "runner", None))
            self.parallel = None

    def _step(self) -> list[EngineCoreOutput]:
        outputs = self.disagg.poll() if self.disagg is not None else []
        if self._in_flight is not None and not self._can_plan_ahead(self._in_flight):
            outputs += self._complete(self._in_flight)
            self._in_flight = None
        plan = self.scheduler.schedule()
        launched = None if plan.is_empty else self.runner.launch(plan, self._in_flight)
        if self._in_flight is not None:
            outputs += self._complete(self._in_flight)
        self._in_flight = launched
        if launched is None and outputs and not self.scheduler.has_unfinished():
            self.check_integrity()  # once, as the engine goes idle
        return outputs

    def _can_plan_ahead(self, in_flight: LaunchedStep) -> bool:
        """Penalties count a request's output tokens on the host, so a request with a token
        still in flight must have it back before its next step is planned."""
        return self.overlap and not any(r.params.uses_penalties for r in in_flight.requests)

    def _complete(self, launched: LaunchedStep) -> list[EngineCoreOutput]:
        sampled, logprobs = launched.results()
        if self.disagg is not None:
            self.disagg.before_update(launched.plan, sampled, logprobs)
        changed = self.scheduler.update(launched.plan, sampled)
        outputs = []
        for req in changed:
            lp = logprobs.get(req.request_id)
            finish = req.finish_reason.value if req.finish_reason is not None else None
            outputs.append(
                EngineCoreOutput(
                    request_id=req.request_id,
                    new_token_ids=[req.output_token_ids[-1]],
                    new_logprobs=[lp] if lp is not None else None,
                    finish_reason=finish,
                    stop_reason=req.stop_reason,
                    num_prompt_tokens=req.num_prompt_tokens,
                    num_cached_tokens=req.num_cached_tokens,
                )
            )
            if req.finish_reason is not None:
                self.requests.pop(req.request_id, None)
        return outputs

    def check_integrity(self) -> None:
        self.kv.check_integrity(self.scheduler.live_block_tables())

    def stats(self) -> EngineStats:
        s = self.scheduler
        return EngineStats(
            num_running=len(s.running),
            num_waiting=len(s.waiting) + (self.disagg.num_pending if self.disagg else 0),
            kv_cache_usage=self.kv.usage,
            prefix_cache_queries=s.counters.prefix_cache_queries,
            prefix_cache_hits=s.counters.prefix_cache_hits,
            num_preemptions=s.counters.preemptions,
        )
