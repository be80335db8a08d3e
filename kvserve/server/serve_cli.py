"""``kvserve serve``: the API process. It spawns the engine-core process, then serves HTTP.

Exit codes: 0 after SIGTERM/SIGINT (in-flight requests drained for up to
``--shutdown-timeout``); 1 when the engine process died (so a supervisor restarts the
server); 2 for bad flags or a model that does not load. The engine process exits (code 3)
within about a second of losing the API process, whatever it was doing."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from pathlib import Path
from types import FrameType

import uvicorn

from kvserve.disagg.transfer import resolve_transfer_backend
from kvserve.engine.config_builder import build_engine_config
from kvserve.engine.ipc.core_client import CoreClient
from kvserve.errors import ConfigError
from kvserve.flags import add_flags, engine_settings
from kvserve.loader import bundled_model_path, load_tokenizer
from kvserve.server.app import create_app
from kvserve.server.context import ServerContext
from kvserve.server.limits import RequestLimits
from kvserve.server.metrics import ServerMetrics

log = logging.getLogger("kvserve.server")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line through the CLI, exit code 2
        raise ConfigError(message)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kvserve serve", description="Run the OpenAI-compatible server.")
    add_flags(p)
    return p


def default_model_name(model: str | None) -> str:
    path = Path(model or bundled_model_path())
    return path.name.split(".")[0] if path.suffix == ".gguf" else (model or path.name)


class DrainingServer(uvicorn.Server):
    """SIGTERM/SIGINT: refuse new requests (503), wait for in-flight ones up to the timeout,
    then stop. A second signal stops at once."""

    def __init__(self, config: uvicorn.Config, ctx: ServerContext, timeout_s: float) -> None:
        super().__init__(config)
        self.ctx, self.timeout_s = ctx, timeout_s
        self.exit_code = 0
        self._loop = asyncio.get_running_loop()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.ctx.draining:
            self.should_exit = self.force_exit = True
            return
        self.ctx.draining = True
        self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._drain()))

    async def _drain(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        log.info("draining %d in-flight requests", self.ctx.client.num_admitted)
        while self.ctx.client.num_admitted > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self.should_exit = True

    def engine_died(self, why: str) -> None:
        self.exit_code = 1
        self.ctx.draining = True
        # a moment for in-flight requests to send their error, then stop
        self._loop.call_later(0.5, self._stop_now)

    def _stop_now(self) -> None:
        self.should_exit = self.force_exit = True


def request_limits(a: argparse.Namespace) -> RequestLimits:
    try:
        return RequestLimits(a.max_n, a.max_prompts_per_request, a.max_stop_strings,
                             a.max_prompt_bytes, a.default_max_tokens)  # fmt: skip
    except ValueError as exc:
        raise ConfigError(f"request limits: {exc}") from None


async def serve(a: argparse.Namespace) -> int:
    config = resolve_transfer_backend(build_engine_config(a.model, **engine_settings(a)))
    if config.node_rank > 0:  # a host without the scheduler: only its tensor-parallel ranks
        from kvserve.distributed.node import run_worker_node

        return await asyncio.to_thread(run_worker_node, config)
    request_limits(a)  # bad limits fail before the engine starts
    client = CoreClient(config, a.log_level)
    tokenizer = load_tokenizer(a.model)
    ready = await client.start()
    log.info("engine ready: pid %d, %s/%s, context %d, %d KV pages (%d tokens, %s)", ready.pid,
             ready.device, ready.dtype, ready.context_length, ready.num_pages,
             ready.num_pages * ready.page_size, ready.kv_cache_dtype)  # fmt: skip
    if config.load_format == "dummy" and ready.vocab_size > tokenizer.vocab_size:
        log.warning("dummy weights over a %d-id vocabulary with a %d-id tokenizer: sampled ids "
                    "from %d up decode to no text (a stream of only those carries none)",
                    ready.vocab_size, tokenizer.vocab_size, tokenizer.vocab_size)  # fmt: skip
    name = a.served_model_name or default_model_name(a.model)
    metrics = ServerMetrics(name)
    metrics.set_cache_config(ready)
    ctx = ServerContext(client, ready, tokenizer, name, metrics, a.tool_call_parser,
                        a.reasoning_parser, config.scheduler.max_queued_requests,
                        created=int(time.time()), limits=request_limits(a),
                        engine_stall_timeout_s=a.engine_stall_timeout,
                        disagg=config.disagg)  # fmt: skip
    client.on_batch = metrics.on_batch
    api_key = a.api_key or os.environ.get("KVSERVE_API_KEY") or None
    app = create_app(ctx, api_key, a.max_request_bytes)
    uv = uvicorn.Config(app, host=a.host, port=a.port, log_level=a.log_level, lifespan="off",
                        access_log=a.log_level == "debug", timeout_graceful_shutdown=5)  # fmt: skip
    server = DrainingServer(uv, ctx, a.shutdown_timeout)
    client.on_dead = server.engine_died
    try:
        await server.serve()
    finally:
        await client.shutdown()
    return server.exit_code


def main(argv: list[str]) -> int:
    a = parser().parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    return asyncio.run(serve(a))
