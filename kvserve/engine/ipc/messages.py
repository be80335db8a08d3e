"""Typed messages between the API process and the engine-core process (ZeroMQ, msgspec;
never pickle). One tagged union per direction, so a receiver decodes with one call."""

from __future__ import annotations

import msgspec

from kvserve.disagg.handle import RemotePrefill
from kvserve.engine.core.outputs import EngineCoreOutput
from kvserve.engine.core.sampling_params import SamplingParams
from kvserve.engine.core.stats import EngineStats


# -- API process -> engine ------------------------------------------------------------------
class AddRequest(msgspec.Struct, tag="add"):
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    remote: RemotePrefill | None = None  # decode mode: fetch the prompt's KV from there


class AbortRequests(msgspec.Struct, tag="abort"):
    request_ids: list[str]


class StopRequest(msgspec.Struct, tag="stop"):
    """The API process found a stop string in the detokenized text."""

    request_id: str
    stop: str


class Shutdown(msgspec.Struct, tag="shutdown"):
    pass


EngineInput = AddRequest | AbortRequests | StopRequest | Shutdown


# -- engine -> API process ------------------------------------------------------------------
class Ready(msgspec.Struct, tag="ready"):
    """Sent once the model is loaded; the API process validates requests against it."""

    pid: int
    model_path: str
    device: str
    dtype: str
    context_length: int
    vocab_size: int
    num_pages: int
    page_size: int
    eos_token_ids: list[int]
    max_running_requests: int
    max_queued_requests: int | None
    # the model's generation_config defaults (None: not set)
    temperature: float | None
    top_p: float | None
    top_k: int | None
    repetition_penalty: float | None
    kv_cache_dtype: str = ""  # the KV pool's dtype (float8_e4m3fn for FP8 KV)
    kv_bytes_per_token: int = 0  # K and V of one token over all layers


class RequestFailed(msgspec.Struct, tag="failed"):
    request_id: str
    message: str
    param: str | None
    status: int = 400  # the HTTP status it maps to (503: a KV transfer failed)


class OutputBatch(msgspec.Struct, tag="outputs"):
    """One engine step's outputs plus a stats snapshot (also sent empty as a heartbeat)."""

    outputs: list[EngineCoreOutput]
    stats: EngineStats
    num_added: int  # AddRequest messages processed so far (monotonic): the rest are in transit
    queue_times: dict[str, float]  # request id -> seconds from arrival to first scheduling
    failed: list[RequestFailed]
    num_handled: int = 0  # messages of any kind processed so far (monotonic): the stats
    # snapshot reflects every message the API process sent when this equals its send count


class Fatal(msgspec.Struct, tag="fatal"):
    message: str


EngineOutput = Ready | OutputBatch | Fatal

_input_decoder = msgspec.msgpack.Decoder(EngineInput)
_output_decoder = msgspec.msgpack.Decoder(EngineOutput)
_encoder = msgspec.msgpack.Encoder()


def encode(message: EngineInput | EngineOutput) -> bytes:
    return _encoder.encode(message)


def decode_input(data: bytes) -> EngineInput:
    return _input_decoder.decode(data)


def decode_output(data: bytes) -> EngineOutput:
    return _output_decoder.decode(data)
