"""What every route needs: the engine client, the tokenizer, the announced limits, metrics,
parsers and the server's life-cycle flags."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from kvserve.config import DisaggConfig
from kvserve.engine.ipc.core_client import CoreClient
from kvserve.engine.ipc.messages import Ready
from kvserve.loader import Tokenizer
from kvserve.server.errors import APIError
from kvserve.server.limits import RequestLimits
from kvserve.server.metrics import ServerMetrics

T = TypeVar("T")


@dataclass
class ServerContext:
    client: CoreClient
    ready: Ready
    tokenizer: Tokenizer
    served_model_name: str
    metrics: ServerMetrics
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    max_queued_requests: int | None = None
    draining: bool = False
    created: int = field(default=0)
    limits: RequestLimits = field(default_factory=RequestLimits)
    engine_stall_timeout_s: float = 60.0  # /health fails after this long without a message
    disagg: DisaggConfig = field(default_factory=DisaggConfig)  # this server's PD side
    # CPU-heavy work (tokenizing, chat templates, decoding) runs here, off the event loop; the
    # tokenizers library releases the GIL, and pure-Python work yields it every few ms.
    pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(4, thread_name_prefix="kvserve-cpu")
    )

    async def off_loop(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.served_model_name:
            raise APIError(
                404, f"the model {model!r} does not exist; this server serves "
                f"{self.served_model_name!r}", "model",
            )  # fmt: skip
