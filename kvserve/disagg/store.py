"""The prefill side's held KV: room -> pages in host memory, each taken once by the decode
engine that fetches it, or dropped once it is older than the transfer timeout."""

from __future__ import annotations

import threading
import time

from kvserve.disagg.blob import PrefilledKV


class HeldKV:
    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._items: dict[str, tuple[float, PrefilledKV]] = {}
        self._lock = threading.Lock()
        self.num_expired = 0

    def put(self, blob: PrefilledKV) -> None:
        with self._lock:
            self._items[blob.header.room] = (time.monotonic() + self.ttl_s, blob)

    def take(self, room: str) -> PrefilledKV | None:
        with self._lock:
            item = self._items.pop(room, None)
        if item is None:
            return None
        deadline, blob = item
        blob.seconds["held"] = time.monotonic() - (deadline - self.ttl_s)
        return blob

    def expire(self) -> int:
        now = time.monotonic()
        with self._lock:
            old = [room for room, (deadline, _) in self._items.items() if deadline < now]
            dropped = [self._items.pop(room)[1] for room in old]
        for blob in dropped:
            blob.release(blob.ready)
        self.num_expired += len(old)
        return len(old)

    def __len__(self) -> int:
        return len(self._items)
