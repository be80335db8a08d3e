"""A prefill worker and two decode workers on the bundled model (real `kvserve serve`
processes, loaded at once for the package), and routers in front of them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from kvserve.server.launch import ServerProcess, free_port, launch_server
from tests.router.conftest import router, sinks  # noqa: F401 (fixtures)
from tests.server.conftest import assert_invariants

TRANSFER_TIMEOUT_S = "8"  # bounded waits on both sides stay short in tests


@dataclass
class PDWorkers:
    prefill: ServerProcess
    decode: ServerProcess
    spare_decode: ServerProcess  # for the test that kills a decode worker
    bootstrap_port: int

    def alive(self) -> list[ServerProcess]:
        return [s for s in (self.prefill, self.decode, self.spare_decode) if s.proc.poll() is None]


@pytest.fixture(scope="package")
def pd() -> Iterator[PDWorkers]:
    port = free_port()
    common = ("--disaggregation-transfer-backend", "tcp",
              "--disaggregation-transfer-timeout", TRANSFER_TIMEOUT_S)  # fmt: skip
    started = [
        # 512-token chunks: a long prompt's prefill spans several steps, for a kill to land in
        # (a prompt alone now prefills in 8K chunks)
        launch_server("--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port",
                      str(port), "--chunked-prefill-size", "512", *common),
        launch_server("--disaggregation-mode", "decode", *common),
        launch_server("--disaggregation-mode", "decode", *common),
    ]  # fmt: skip
    try:
        for s in started:
            s.wait_healthy(900)  # three at once on a busy 2-core box can be slow
        yield PDWorkers(*started, bootstrap_port=port)
    finally:
        for s in started:
            s.stop()


@pytest.fixture
def kv_integrity(pd: PDWorkers) -> Iterator[None]:
    """After every test: each live worker goes idle with every KV page back and its admission
    ledger settled (the engines check KV integrity themselves as they go idle)."""
    yield
    for s in pd.alive():
        assert_invariants(s.url)
