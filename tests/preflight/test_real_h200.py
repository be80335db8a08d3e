"""Parsers on outputs recorded on a real H200 machine (1 GPU, driver 580.159.04, 2026-11-29)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import replay_runner

from kvserve.preflight.checks.nccl import check_nccl
from kvserve.preflight.facts import IbFacts
from kvserve.preflight.options import PreflightOptions
from kvserve.preflight.probes.gpu import read_smi
from kvserve.preflight.probes.gpu_nvml import facts_from_nvml
from kvserve.preflight.probes.nccl import apply_result, parse_nccl_log
from kvserve.preflight.result import Status


def test_nvml_and_nvidia_smi_recordings_agree(fixtures: Path) -> None:
    nvml = facts_from_nvml(json.loads((fixtures / "nvml_h200_real.json").read_text()))
    run = replay_runner(
        {
            "nvidia-smi --query-gpu": "nvidia-smi_query_h200_real.csv",
            "nvidia-smi -q": "nvidia-smi_q_h200_real.txt",
        }
    )
    smi = facts_from_nvml(read_smi(run))
    assert nvml.driver_version == smi.driver_version == "580.159.04"
    assert nvml.cuda_driver_version == smi.cuda_driver_version == "13.0"
    a, b = nvml.devices[0], smi.devices[0]
    assert a.name == b.name == "NVIDIA H200"
    assert a.memory_total_mib == b.memory_total_mib == 143771
    assert a.compute_capability == b.compute_capability == (9, 0)
    assert (a.pcie_gen, a.pcie_width) == (b.pcie_gen, b.pcie_width) == (5, 16)
    assert a.fabric_state == b.fabric_state == "not_supported"  # single GPU: no NVSwitch
    assert a.temp_slowdown_c == 89


def test_single_gpu_nccl_log_reports_socket_and_no_bandwidth(fixtures: Path) -> None:
    log = (fixtures / "nccl_h200_1gpu_real.log").read_text()
    facts = apply_result(parse_nccl_log(log), log)
    assert facts.version == "2.28.9+cuda13.0"
    assert (facts.network, facts.nodes, facts.ranks) == ("Socket", 1, 1)
    assert facts.net_devices == ["eth0:192.0.2.2<0>"]  # "[RO]" flags are not devices
    run, transport = check_nccl(facts, IbFacts(), PreflightOptions(nccl=True))
    assert run.status is Status.PASS and "bandwidth n/a" in run.observed
    assert transport.status is Status.PASS and "none (one rank)" in transport.observed
