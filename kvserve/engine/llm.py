"""The offline API: ``LLM(model=None, **settings).generate(...) / .chat(...)``.

It drives the same engine core the server runs, in-process: tokenize, add requests, step until
every request finished, detokenize."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from kvserve.engine.config_builder import build_engine_config
from kvserve.engine.core.sampling_params import SamplingParams
from kvserve.engine.engine_core import EngineCore
from kvserve.engine.output_processor import OutputProcessor, StreamState
from kvserve.engine.request_output import CompletionOutput, RequestOutput
from kvserve.errors import InvalidRequestError
from kvserve.loader import Tokenizer

Prompt = str | list[int]
Message = dict[str, Any]


class LLM:
    def __init__(self, model: str | None = None, **settings: Any) -> None:
        self.config = build_engine_config(model, **settings)
        self.engine = EngineCore(self.config)
        self._ids = itertools.count()

    @property
    def tokenizer(self) -> Tokenizer:
        return self.engine.source.tokenizer

    def default_sampling_params(self) -> SamplingParams:
        d = self.engine.source.generation_defaults
        overrides = {
            k: v
            for k, v in (
                ("temperature", d.temperature),
                ("top_p", d.top_p),
                ("top_k", d.top_k),
                ("repetition_penalty", d.repetition_penalty),
            )
            if v is not None
        }
        return SamplingParams(**overrides)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        batch = _as_prompt_list(prompts)
        texts = [p if isinstance(p, str) else None for p in batch]
        ids = [self._encode(p) for p in batch]
        return self._run(texts, ids, sampling_params)

    def chat(
        self,
        messages: list[Message] | list[list[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[RequestOutput]:
        if not messages:
            raise InvalidRequestError("messages must not be empty", param="messages")
        conversations = [messages] if isinstance(messages[0], dict) else messages
        texts = [
            self.tokenizer.apply_chat_template(
                c, add_generation_prompt=add_generation_prompt, tools=tools
            )
            for c in conversations
        ]
        ids = [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]
        return self._run(texts, ids, sampling_params)

    def _encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("the prompt is empty", param="prompt")
            return self.tokenizer.encode(prompt, add_special_tokens=True)
        return list(prompt)

    def _run(
        self,
        texts: list[str | None],
        prompt_ids: list[list[int]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
    ) -> list[RequestOutput]:
        params = _params_per_prompt(sampling_params, len(prompt_ids), self.default_sampling_params)
        for ids, p in zip(prompt_ids, params):
            self.engine.validate_prompt(ids, p)  # fail before anything is queued
        dummy = self.config.load_format == "dummy"
        processor = OutputProcessor(None if dummy else self.tokenizer)
        groups: list[list[str]] = []
        for ids, p in zip(prompt_ids, params):
            base = str(next(self._ids))
            children = [f"{base}-{i}" for i in range(p.n)]
            for i, child in enumerate(children):
                child_params = p if p.seed is None or i == 0 else replace(p, seed=p.seed + i)
                self.engine.add_request(child, ids, child_params)
                processor.add(child, ids, child_params)
            groups.append(children)
        finished = self._drain(processor)
        return [
            _request_output(texts[i], prompt_ids[i], [finished[c] for c in group])
            for i, group in enumerate(groups)
        ]

    def _drain(self, processor: OutputProcessor) -> dict[str, StreamState]:
        finished: dict[str, StreamState] = {}
        while self.engine.has_unfinished():
            for out in self.engine.step():
                state, stop_hit = processor.process(out)
                if stop_hit is not None:
                    self.engine.stop_request(out.request_id, stop_hit)
                if state.finished:
                    finished[out.request_id] = state
        return finished


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    prompts = list(prompts)
    if not prompts:
        raise InvalidRequestError("no prompts given", param="prompt")
    if all(isinstance(t, int) for t in prompts):
        return [prompts]  # one prompt of token ids
    return prompts


def _params_per_prompt(
    params: SamplingParams | Sequence[SamplingParams] | None, n: int, default: Any
) -> list[SamplingParams]:
    if params is None:
        return [default() for _ in range(n)]
    if isinstance(params, SamplingParams):
        return [params] * n
    params = list(params)
    if len(params) != n:
        raise InvalidRequestError(f"got {len(params)} sampling params for {n} prompts")
    return params


def _request_output(
    prompt: str | None, prompt_ids: list[int], states: list[StreamState]
) -> RequestOutput:
    outputs = [
        CompletionOutput(
            index=i,
            text=s.text,
            token_ids=s.token_ids,
            finish_reason=s.finish_reason,
            stop_reason=s.stop_reason,
            logprobs=s.logprobs if s.params.logprobs is not None else None,
        )
        for i, s in enumerate(states)
    ]
    return RequestOutput(
        request_id=states[0].request_id.rsplit("-", 1)[0],
        prompt=prompt,
        prompt_token_ids=prompt_ids,
        outputs=outputs,
        num_cached_tokens=states[0].num_cached_tokens,
    )
