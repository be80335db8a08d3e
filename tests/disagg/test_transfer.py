"""The transfer seam without servers: pages exported from one KV pool cross the bootstrap
channel on each backend that runs here and import into another pool bit for bit; a room is
handed out once; held KV expires; a refusal is a TransferError with the reason."""

from __future__ import annotations

import time

import pytest
import torch

from kvserve.disagg.blob import KVHeader, PrefilledKV
from kvserve.disagg.bootstrap import BootstrapServer, fetch
from kvserve.disagg.framing import TransferError
from kvserve.disagg.store import HeldKV
from kvserve.disagg.transfer import make_transport, probe
from kvserve.engine.runner.kv_pool import KVPool, PageGeometry
from kvserve.server.launch import free_port

GEOMETRY = PageGeometry(num_layers=3, num_pages=8, page_size=4, num_kv_heads=2, head_dim=8)


def _blob(pool: KVPool, room: str, pages: list[int]) -> PrefilledKV:
    host = pool.export_pages(pages)
    header = KVHeader(room=room, prompt_token_ids=list(range(10)), first_token_id=5,
                      first_logprob=None, num_cached_tokens=4,
                      dtype=str(host.dtype).removeprefix("torch."), shape=list(host.shape),
                      k_scales=pool.k_scales.tolist(), v_scales=pool.v_scales.tolist(),
                      nbytes=host.numel() * host.element_size())  # fmt: skip
    return PrefilledKV(header, host)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float8_e4m3fn])
@pytest.mark.parametrize("backend", ["tcp", "nixl"])
def test_pages_cross_from_pool_to_pool_intact(backend: str, dtype: torch.dtype) -> None:
    why = probe(backend)
    if why is not None:
        pytest.skip(why)
    src = KVPool.allocate(GEOMETRY, dtype, torch.device("cpu"))
    for layer in src.layers:
        layer.copy_(torch.randn(layer.shape).to(dtype))
    dst = KVPool.allocate(GEOMETRY, dtype, torch.device("cpu"))
    held, port = HeldKV(30.0), free_port()
    server = BootstrapServer("127.0.0.1", port, held, make_transport(backend), 30.0)
    try:
        server.put(_blob(src, "room-1", [6, 2, 5]))
        got = fetch("127.0.0.1", port, "room-1", make_transport(backend), 30.0)
        assert got.header.first_token_id == 5 and got.header.num_cached_tokens == 4
        dst.import_pages([0, 1, 2], got.pages)
        for a, b in zip(src.layers, dst.layers):
            assert torch.equal(a[:, [6, 2, 5]].view(torch.uint8), b[:, :3].view(torch.uint8))
        assert len(held) == 0
        with pytest.raises(TransferError, match="no KV held for room 'room-1'"):
            fetch("127.0.0.1", port, "room-1", make_transport(backend), 30.0)
        other = "nixl" if backend == "tcp" else "tcp"
        server.put(_blob(src, "room-2", [1]))
        if probe(other) is None:
            with pytest.raises(TransferError, match=f"transfers with {backend}"):
                fetch("127.0.0.1", port, "room-2", make_transport(other), 30.0)
    finally:
        server.close()


def test_held_kv_expires() -> None:
    held = HeldKV(0.05)
    pool = KVPool.allocate(GEOMETRY, torch.float32, torch.device("cpu"))
    held.put(_blob(pool, "old", [0]))
    assert held.expire() == 0
    time.sleep(0.1)
    assert held.expire() == 1 and held.take("old") is None


def test_nothing_listening_is_a_transfer_error() -> None:
    port = free_port()
    with pytest.raises(TransferError, match="failed"):
        fetch("127.0.0.1", port, "r", make_transport("tcp"), 5.0)
