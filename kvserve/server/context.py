"""What every route needs: the engine client, the tokenizer, the announced limits, metrics,
parsers and the server's life-cycle flags."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvserve.engine.ipc.core_client import CoreClient
from kvserve.engine.ipc.messages import Ready
from kvserve.loader import Tokenizer
from kvserve.server.errors import APIError
from kvserve.server.metrics import ServerMetrics


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
    num_in_flight: int = 0  # HTTP requests that hold engine requests
    created: int = field(default=0)

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.served_model_name:
            raise APIError(
                404, f"the model {model!r} does not exist; this server serves "
                f"{self.served_model_name!r}", "model",
            )  # fmt: skip

    def check_accepting(self, num_requests: int) -> None:
        if self.client.dead is not None:
            raise APIError(503, f"the engine is not running: {self.client.dead}")
        if self.draining:
            raise APIError(503, "the server is shutting down")
        limit = self.max_queued_requests
        if limit is not None and self.client.num_waiting + num_requests > limit:
            raise APIError(
                429, f"too many requests waiting ({self.client.num_waiting}; the limit is "
                f"{limit}); retry later",
            )  # fmt: skip
