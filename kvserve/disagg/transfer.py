"""The KV transfer seam: a ``Transport`` moves one ``PrefilledKV`` over an open bootstrap
connection (``send_pages`` on the prefill side, ``recv_pages`` on the decode side); the
bootstrap control channel (``bootstrap.py``) is the same for every backend.

Backends, in the order ``auto`` tries them: Mooncake's transfer engine, NIXL (UCX), plain TCP.
``probe(name)`` says why a backend cannot run here; ``make_transport`` picks one."""

from __future__ import annotations

import dataclasses
import importlib
import logging
import socket
from typing import Protocol

from kvserve.config import EngineConfig
from kvserve.disagg.blob import PrefilledKV
from kvserve.disagg.staging import HostStaging
from kvserve.errors import ConfigError

log = logging.getLogger("kvserve.disagg")
BACKENDS = ("mooncake", "nixl", "tcp")


class Transport(Protocol):
    name: str

    def send_pages(self, conn: socket.socket, blob: PrefilledKV) -> None:
        """``blob``'s pages are in host memory (the bootstrap server waited for their copies)."""

    def recv_pages(self, conn: socket.socket, deadline: float) -> PrefilledKV: ...


def probe(name: str) -> str | None:
    """None when backend ``name`` runs here, else why not (one line)."""
    if name == "tcp":
        return None
    if name == "nixl":
        try:
            from kvserve.disagg.transfer_nixl import nixl_agent_class

            nixl_agent_class()
        except Exception as exc:  # an ImportError, or a missing shared library
            return f"nixl does not load: {type(exc).__name__}: {exc}"
        return None
    if name == "mooncake":
        try:
            importlib.import_module("mooncake.engine")
        except Exception as exc:
            return f"mooncake-transfer-engine does not load: {type(exc).__name__}: {exc}"
        return "the Mooncake backend is not built yet (its wheel loads, but kvserve has no adapter)"
    raise ConfigError(f"unknown transfer backend {name!r}; one of {', '.join(BACKENDS)}")


def resolve_backend(name: str) -> str:
    """``auto`` -> the first backend that runs here; a named one that cannot -> ConfigError."""
    if name != "auto":
        why = probe(name)
        if why is not None:
            raise ConfigError(f"--disaggregation-transfer-backend {name}: {why}")
        return name
    for candidate in BACKENDS:
        why = probe(candidate)
        if why is None:
            return candidate
        log.info("transfer backend %s skipped: %s", candidate, why)
    raise AssertionError("tcp always runs")


def make_transport(name: str, staging: HostStaging | None = None) -> Transport:
    """``staging``: where received pages land (TCP; NIXL registers its own buffers)."""
    name = resolve_backend(name)
    if name == "nixl":
        from kvserve.disagg.transfer_nixl import NixlTransport

        return NixlTransport()
    from kvserve.disagg.transfer_tcp import TcpTransport

    return TcpTransport(staging)


def resolve_transfer_backend(config: EngineConfig) -> EngineConfig:
    """The config with ``auto`` replaced by the backend picked here, so that the API process
    (which names it in ``kv_transfer_params``) and the engine agree; unchanged in normal mode."""
    d = config.disagg
    if d.disaggregation_mode == "null":
        return config
    name = resolve_backend(d.disaggregation_transfer_backend)
    disagg = dataclasses.replace(d, disaggregation_transfer_backend=name)
    return dataclasses.replace(config, disagg=disagg)
