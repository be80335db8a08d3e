"""Rank 0 -> every rank: one pickled message per step (the step's host arrays), broadcast on
the gloo group. A message that fits the fixed buffer costs one broadcast; a larger one a
second."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from kvserve.distributed.parallel_state import TPGroup

_BUFFER = 64 * 1024
_HEADER = 8


class PlanChannel:
    def __init__(self, tp: TPGroup) -> None:
        self.tp = tp
        self.buf = torch.empty(_BUFFER, dtype=torch.uint8)

    def send(self, message: Any) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        n = len(data)
        view = self.buf.numpy()
        view[:_HEADER] = np.frombuffer(n.to_bytes(_HEADER, "little"), np.uint8)
        head = min(n, _BUFFER - _HEADER)
        view[_HEADER : _HEADER + head] = np.frombuffer(data, np.uint8, head)
        dist.broadcast(self.buf, 0, group=self.tp.cpu_group)
        if n > head:
            rest = torch.frombuffer(bytearray(data[head:]), dtype=torch.uint8)
            dist.broadcast(rest, 0, group=self.tp.cpu_group)

    def recv(self) -> Any:
        dist.broadcast(self.buf, 0, group=self.tp.cpu_group)
        view = self.buf.numpy()
        n = int.from_bytes(view[:_HEADER].tobytes(), "little")
        head = min(n, _BUFFER - _HEADER)
        data = view[_HEADER : _HEADER + head].tobytes()
        if n > head:
            rest = torch.empty(n - head, dtype=torch.uint8)
            dist.broadcast(rest, 0, group=self.tp.cpu_group)
            data += rest.numpy().tobytes()
        return pickle.loads(data)
