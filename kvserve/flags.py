"""The ``kvserve serve`` flag table: one list of specs, SGLang names first and vLLM aliases
after. Specs marked ``engine`` become ``build_engine_config`` settings under their ``dest``."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from kvserve.server.reasoning_parsers import REASONING_PARSERS
from kvserve.server.tool_parsers import TOOL_PARSERS


@dataclass(frozen=True)
class Flag:
    names: tuple[str, ...]
    help: str
    type: Any = str
    default: Any = None
    engine: bool = False
    choices: tuple[str, ...] | None = None
    switch: bool = False  # store_true

    @property
    def dest(self) -> str:
        return self.names[0].lstrip("-").replace("-", "_")


FLAGS: list[Flag] = [
    # -- server
    Flag(("--model",), "HF model directory or .gguf file (default: the bundled SmolLM2-135M)"),
    Flag(("--served-model-name",), "model name in the API (default: derived from --model)"),
    Flag(("--host",), "address to listen on", default="127.0.0.1"),
    Flag(("--port",), "port to listen on", type=int, default=8000),
    Flag(("--api-key",), "require 'Authorization: Bearer KEY' (default: $KVSERVE_API_KEY)"),
    Flag(
        ("--tool-call-parser",), "parse tool calls out of chat answers", choices=tuple(TOOL_PARSERS)
    ),  # fmt: skip
    Flag(
        ("--reasoning-parser",),
        "split <think>...</think> into reasoning_content",
        choices=tuple(REASONING_PARSERS),
    ),  # fmt: skip
    Flag(("--max-request-bytes",), "larger request bodies get 413", type=int, default=16 << 20),
    # -- per-request limits (a request over one gets a 400 naming the field)
    Flag(("--max-n",), "most choices (n) one request may ask for", type=int, default=16),
    Flag(
        ("--max-prompts-per-request",),
        "most prompts in one completions request",
        type=int,
        default=64,
    ),  # fmt: skip
    Flag(("--max-stop-strings",), "most stop strings in one request", type=int, default=16),
    Flag(
        ("--max-prompt-bytes",),
        "most UTF-8 bytes of prompt text (or message text) in one request",
        type=int,
        default=8 << 20,
    ),  # fmt: skip
    Flag(
        ("--default-max-tokens",),
        "max_tokens when a request leaves it out or null (cut to the room left in the context)",
        type=int,
        default=4096,
    ),  # fmt: skip
    Flag(
        ("--engine-stall-timeout",),
        "seconds without a message from the engine after which /health fails",
        type=float,
        default=60.0,
    ),  # fmt: skip
    Flag(
        ("--shutdown-timeout",),
        "seconds SIGTERM waits for in-flight requests",
        type=float,
        default=30.0,
    ),  # fmt: skip
    Flag(
        ("--log-level",),
        "logging level",
        default="info",
        choices=("debug", "info", "warning", "error"),
    ),  # fmt: skip
    Flag(
        ("--tp", "--tensor-parallel-size"),
        "tensor-parallel size: ranks (GPUs) one engine spans, one process each",
        type=int,
        default=1,
        engine=True,
    ),  # fmt: skip
    Flag(("--nnodes",), "hosts the --tp ranks span (default 1)", type=int, engine=True),
    Flag(
        ("--node-rank",),
        "this host's index (0 runs the scheduler and API; others only their ranks)",
        type=int,
        engine=True,
    ),  # fmt: skip
    Flag(
        ("--dist-init-addr",),
        "host:port of node 0's torch.distributed rendezvous (needed with --nnodes > 1)",
        engine=True,
    ),  # fmt: skip
    # -- engine
    Flag(
        ("--dtype",),
        "weights/activations dtype",
        engine=True,
        choices=("auto", "float32", "bfloat16", "float16"),
    ),  # fmt: skip
    Flag(("--device",), "auto, cpu, cuda or cuda:N", engine=True),
    Flag(("--seed",), "engine seed for requests without their own", type=int, engine=True),
    Flag(
        ("--context-length", "--max-model-len"),
        "max tokens per sequence (prompt + output)",
        type=int,
        engine=True,
    ),  # fmt: skip
    Flag(("--page-size", "--block-size"), "tokens per KV page", type=int, engine=True),
    Flag(("--max-total-tokens",), "KV cache size in tokens", type=int, engine=True),
    Flag(
        ("--mem-fraction-static", "--gpu-memory-utilization"),
        "share of GPU memory for weights + KV cache",
        type=float,
        engine=True,
    ),  # fmt: skip
    Flag(
        ("--max-running-requests", "--max-num-seqs"),
        "most requests in a batch (default: from the KV pool, its tokens / 2048 down to a "
        "multiple of 16, 256 to 1024)",
        type=int,
        engine=True,
    ),  # fmt: skip
    Flag(
        ("--schedule-conservativeness",),
        "room admission keeps for running requests' future output: 1 (default) as SGLang, "
        "higher for fewer preemptions, 0 for none kept",
        type=float,
        engine=True,
    ),  # fmt: skip
    Flag(("--max-num-batched-tokens",), "token budget of one step", type=int, engine=True),
    Flag(
        ("--chunked-prefill-size",),
        "most prompt tokens one request prefills per step",
        type=int,
        engine=True,
    ),  # fmt: skip
    Flag(
        ("--prefill-chunk-while-decoding",),
        "most prompt tokens one request prefills per step while others decode or wait (a "
        "decode's time per token is the step's)",
        type=int,
        engine=True,
    ),  # fmt: skip
    Flag(
        ("--chunk-attention-budget",),
        "while others decode or wait, a prefill chunk at context c takes at most this / c tokens "
        "(0, the default: off; 33554432 = 2048 x 16K)",
        type=int,
        engine=True,
    ),  # fmt: skip
    Flag(
        ("--max-queued-requests",), "waiting requests beyond this get 429", type=int, engine=True
    ),  # fmt: skip
    Flag(
        ("--disable-prefix-cache",), "turn the radix prefix cache off", switch=True, engine=True
    ),  # fmt: skip
    Flag(
        ("--kv-cache-dtype",),
        "KV cache dtype: auto (the model dtype) or fp8_e4m3 (alias fp8; half the bytes)",
        engine=True,
    ),
    Flag(
        ("--attention-backend",),
        "attention kernels",
        engine=True,
        choices=("auto", "torch", "triton"),
    ),  # fmt: skip
    Flag(
        ("--prefill-attention-backend",),
        "prefill attention of the triton backend: its kernel (triton), cuDNN's paged SDPA for "
        "large steps (cudnn; needs nvidia-cudnn-frontend), or cudnn where it can run (auto)",
        engine=True,
        choices=("auto", "triton", "cudnn"),
    ),  # fmt: skip
    Flag(
        ("--load-format",),
        "auto, or dummy (random weights)",
        engine=True,
        choices=("auto", "dummy"),
    ),  # fmt: skip
    Flag(
        ("--quantization",),
        "weight quantization: the checkpoint's (auto), or a scheme to quantize an unquantized "
        "checkpoint to at load (fp8)",
        engine=True,
    ),  # fmt: skip
    Flag(("--enforce-eager",), "no CUDA graphs", switch=True, engine=True),
    Flag(
        ("--disable-overlap-schedule",),
        "wait for each step's tokens before planning the next (no overlap of host and GPU)",
        switch=True,
        engine=True,
    ),  # fmt: skip
    Flag(
        ("--enable-overlap-schedule", "--async-scheduling"),
        "plan the next step while one runs, on CPU too (the default on CUDA)",
        switch=True,
        engine=True,
    ),  # fmt: skip
    Flag(
        ("--disable-pdl",),
        "launch the Triton kernels without programmatic dependent launch (sm_90+)",
        switch=True,
        engine=True,
    ),  # fmt: skip
    Flag(
        ("--cuda-graph-max-bs",),
        "largest decode batch captured in a CUDA graph (default: --max-running-requests)",
        type=int,
        engine=True,
    ),  # fmt: skip
    # -- prefill/decode disaggregation (kvserve/disagg)
    Flag(
        ("--disaggregation-mode",),
        "null (a normal server), prefill or decode: one side of a PD pair behind kvserve route",
        engine=True,
        choices=("null", "prefill", "decode"),
    ),  # fmt: skip
    Flag(
        ("--disaggregation-bootstrap-port",),
        "prefill: the port decode workers fetch KV pages from (default 8998)",
        type=int,
        engine=True,
    ),  # fmt: skip
    Flag(
        ("--disaggregation-bootstrap-host",),
        "prefill: the address decode workers reach that port at (default 127.0.0.1)",
        engine=True,
    ),  # fmt: skip
    Flag(
        ("--disaggregation-transfer-backend",),
        "KV transfer library: auto (the first that runs here), mooncake, nixl or tcp",
        engine=True,
        choices=("auto", "mooncake", "nixl", "tcp"),
    ),  # fmt: skip
    Flag(
        ("--disaggregation-transfer-timeout",),
        "seconds a KV transfer may take, and a prefill worker holds KV nobody fetched (60)",
        type=float,
        engine=True,
    ),  # fmt: skip
    Flag(
        ("--disaggregation-staging-gb",),
        "host memory kept for KV transfers, reused and pinned on CUDA (8; 0: a fresh buffer each)",
        type=float,
        engine=True,
    ),  # fmt: skip
]


def add_flags(parser: argparse.ArgumentParser, engine_only: bool = False) -> None:
    server = parser.add_argument_group("server")
    engine = parser.add_argument_group("engine")
    for f in FLAGS:
        if engine_only and not f.engine:
            continue
        group = engine if f.engine else server
        if f.switch:
            group.add_argument(*f.names, dest=f.dest, action="store_true", help=f.help)
            continue
        help_text = f.help + (f" (default: {f.default})" if f.default is not None else "")
        group.add_argument(*f.names, dest=f.dest, type=f.type, default=f.default,
                           choices=f.choices, help=help_text)  # fmt: skip


def engine_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Only what the user set: the config dataclasses keep their own defaults."""
    settings = {f.dest: getattr(args, f.dest) for f in FLAGS if f.engine}
    return {k: v for k, v in settings.items() if v is not None and v is not False}
