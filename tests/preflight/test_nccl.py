from __future__ import annotations

from pathlib import Path

import pytest

from kvserve.preflight.checks.nccl import check_nccl
from kvserve.preflight.facts import IbDevice, IbFacts, NcclFacts
from kvserve.preflight.options import PreflightOptions
from kvserve.preflight.probes.nccl import apply_result, nccl_env, parse_nccl_log, probe_nccl
from kvserve.preflight.result import Status

IB = IbFacts(devices=[IbDevice("mlx5_0", "28.39.2048", "MT4129", "MT_0000000838")])
OPTS = PreflightOptions(nccl=True)


def _facts(fixtures: Path, name: str) -> NcclFacts:
    log = (fixtures / name).read_text()
    return apply_result(parse_nccl_log(log), log)


def test_ib_log_parses_network_devices_and_transports(fixtures: Path) -> None:
    facts = _facts(fixtures, "nccl_ib_2nodes.log")
    assert facts.version == "2.21.5+cuda12.4"
    assert facts.network == "IB" and facts.nodes == 2
    assert facts.net_devices[:2] == ["mlx5_0:1/IB", "mlx5_3:1/IB"] and len(facts.net_devices) == 8
    assert facts.transports == ["NET/IB/GDRDMA", "P2P/CUMEM"]
    assert facts.ranks == 16 and facts.ok
    # busbw = algbw * 2(n-1)/n
    assert facts.algbw_gbs == pytest.approx(268435456 / 0.00289 / 1e9)
    assert facts.busbw_gbs == pytest.approx(facts.algbw_gbs * 30 / 16)


def test_socket_fallback_fails_where_ib_exists(fixtures: Path) -> None:
    facts = _facts(fixtures, "nccl_socket_fallback.log")
    assert facts.network == "Socket" and facts.net_devices == ["eth0:10.20.0.17<0>"]
    rows = {r.name: r for r in check_nccl(facts, IB, OPTS)}
    transport = rows["nccl: transport"]
    assert transport.status is Status.FAIL
    assert "NET/Socket" in transport.observed and "NCCL_IB_HCA" in transport.fix
    ib_rows = {r.name: r for r in check_nccl(_facts(fixtures, "nccl_ib_2nodes.log"), IB, OPTS)}
    assert ib_rows["nccl: transport"].status is Status.PASS
    assert "busbw" in ib_rows["nccl: all-reduce"].observed


def test_single_host_without_p2p_warns(fixtures: Path) -> None:
    facts = _facts(fixtures, "nccl_single_host_shm.log")
    assert facts.transports == ["SHM"]
    row = check_nccl(facts, IbFacts(), OPTS)[1]
    assert row.status is Status.WARN and "P2P is off" in row.fix


def test_nccl_not_requested_is_skipped() -> None:
    rows = check_nccl(
        NcclFacts(ran=False, reason="not run: add --nccl"), IbFacts(), PreflightOptions()
    )
    assert [r.status for r in rows] == [Status.SKIP, Status.SKIP]


def test_env_keeps_nvls_off_and_debug_on() -> None:
    env = nccl_env({"NCCL_NVLS_ENABLE": "1", "PATH": "/bin"})
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["NCCL_DEBUG"] == "INFO"
    assert env["PATH"] == "/bin"


def test_worker_without_gpu_reports_failure_not_crash() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    facts = probe_nccl(size_mb=1, iters=1, timeout=120)
    assert not facts.ok
    assert "no CUDA GPU visible to torch" in facts.reason
    assert check_nccl(facts, IbFacts(), OPTS)[0].status is Status.FAIL
