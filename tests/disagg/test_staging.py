"""The transfer's host staging pool (reuse, its bound, one-off buffers past it) and the bulk
socket phase's failure paths (a stalled peer hits the deadline, a closed one is reported)."""

from __future__ import annotations

import socket
import time

import pytest
import torch

from kvserve.disagg.framing import TransferError, recv_bulk, send_bulk
from kvserve.disagg.staging import HostStaging, capacity_for
from kvserve.engine.runner.kv_pool import KVPool, PageGeometry

MB = 1 << 20


def test_blocks_are_reused_and_bounded() -> None:
    pool = HostStaging(3 * MB, pin=False)
    a = pool.take(MB + 5)
    assert a.data.numel() == MB + 5 and pool.pooled_bytes == capacity_for(MB + 5) == 2 * MB
    block = a.data.data_ptr()
    a.give_back()
    b = pool.take(MB)  # fits the idle block: no new memory
    assert b.data.data_ptr() == block and pool.pooled_bytes == 2 * MB
    c = pool.take(2 * MB)  # the bound has 1 MB left: a one-off buffer, not pooled
    assert pool.num_one_off == 1 and pool.pooled_bytes == 2 * MB and c.data.numel() == 2 * MB
    c.give_back()  # a one-off buffer is simply dropped
    b.give_back()
    d = pool.take(3 * MB)  # the idle 2 MB block is dropped to make room
    assert pool.pooled_bytes == 3 * MB and pool.num_one_off == 1
    d.give_back()
    d.give_back()  # twice is harmless


def test_zero_bound_gives_one_off_buffers() -> None:
    pool = HostStaging(0, pin=False)
    s = pool.take(1000)
    assert s.data.numel() == 1000 and pool.pooled_bytes == 0 and pool.num_one_off == 1


def test_bulk_receive_from_a_stalled_peer_times_out() -> None:
    a, b = socket.socketpair()
    with a, b:
        buf = torch.empty(4 * MB, dtype=torch.uint8)
        a.sendall(b"x" * 1000)  # then nothing more
        b.settimeout(30.0)
        with pytest.raises(TransferError, match="timed out"):
            recv_bulk(b, memoryview(buf.numpy()), time.monotonic() + 0.3)
        assert b.gettimeout() == 30.0  # the socket's own timeout is back


def test_bulk_transfer_intact_and_a_closed_peer_is_reported() -> None:
    a, b = socket.socketpair()
    data = torch.randint(0, 255, (3 * MB + 7,), dtype=torch.uint8)
    got = torch.empty_like(data)
    with b:
        with a:
            a.settimeout(5.0)
            b.settimeout(5.0)
            # both ends in one thread: the socket buffers hold less than 3 MB, so send a part
            send_bulk(a, memoryview(data.numpy())[:1000], time.monotonic() + 5)
            recv_bulk(b, memoryview(got.numpy())[:1000], time.monotonic() + 5)
            assert torch.equal(got[:1000], data[:1000])
            a.sendall(b"y" * 10)
        with pytest.raises(TransferError, match="closed the connection"):
            recv_bulk(b, memoryview(got.numpy()), time.monotonic() + 5)


def test_reserve_makes_blocks_up_front_within_the_bound() -> None:
    pool = HostStaging(3 * MB, pin=False)
    assert pool.reserve(MB, 5) == 3 and pool.pooled_bytes == 3 * MB
    s = pool.take(MB - 10)  # one of the reserved blocks
    assert pool.pooled_bytes == 3 * MB and pool.num_one_off == 0
    s.give_back()


def test_export_nbytes_is_what_an_export_takes() -> None:
    geometry = PageGeometry(num_layers=3, num_pages=8, page_size=4, num_kv_heads=2, head_dim=8)
    kv = KVPool.allocate(geometry, torch.float32, torch.device("cpu"))
    host = kv.export_pages(list(range(kv.pages_for(10))))
    assert kv.export_nbytes(kv.pages_for(10)) == host.numel() * host.element_size()
