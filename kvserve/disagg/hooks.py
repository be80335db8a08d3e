"""What the engine core calls in a disaggregated mode, in one small interface: the prefill
side captures KV before a first token finishes its request, the decode side brings fetched KV
into the running batch. A normal engine has no hook (None); ``engine_hook.py`` makes one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvserve.engine.core.outputs import EngineCoreOutput, TokenLogprobs
from kvserve.engine.core.scheduler_output import SchedulerOutput

if TYPE_CHECKING:
    from kvserve.disagg.handle import RemotePrefill
    from kvserve.engine.core.request import Request


class EngineHook:
    """No-op defaults; each side overrides what it uses."""

    mode = "null"

    def before_update(self, plan: SchedulerOutput, sampled: dict[str, int],
                      logprobs: dict[str, TokenLogprobs]) -> None:  # fmt: skip
        """A step's tokens are back and its requests still hold their pages."""

    def add(self, request: Request, remote: RemotePrefill) -> None:
        raise ValueError("kv_transfer_params are only accepted by a decode worker "
                         "(--disaggregation-mode decode)")  # fmt: skip

    def poll(self) -> list[EngineCoreOutput]:
        return []

    def abort(self, request_id: str) -> bool:
        """True when the hook held the request (it is gone now)."""
        return False

    def take_failed(self) -> list[tuple[str, str]]:
        """(request id, why) of requests that failed in the hook since the last call."""
        return []

    @property
    def num_pending(self) -> int:
        """Requests the hook holds outside the scheduler (counted as waiting)."""
        return 0

    def close(self) -> None:
        pass
