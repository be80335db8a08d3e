from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import replay_runner

from kvserve.preflight.probes import gpu_smi
from kvserve.preflight.probes.gpu import probe_gpus, read_smi
from kvserve.preflight.probes.gpu_nvml import NvmlUnavailable, facts_from_nvml, init_nvml


def _nvml_works() -> bool:
    try:
        init_nvml().nvmlShutdown()
    except NvmlUnavailable:
        return False
    return True


def test_nvml_dict_becomes_facts(fixtures: Path) -> None:
    facts = facts_from_nvml(json.loads((fixtures / "nvml_hgx_h100_healthy.json").read_text()))
    assert facts.driver_version == "550.90.07"
    assert facts.cuda_driver_version == "12.4"
    assert len(facts.devices) == 8
    d = facts.devices[3]
    assert d.name == "NVIDIA H100 80GB HBM3"
    assert d.memory_total_mib == 81559
    assert d.compute_capability == (9, 0)
    assert d.persistence_mode is True
    assert d.power_limit_w == 700.0
    assert d.nvlink_states == [True] * 18
    assert (d.fabric_state, d.fabric_status) == ("completed", "success")


def test_query_csv_parses_values_and_na(fixtures: Path) -> None:
    driver, rows = gpu_smi.parse_query_csv((fixtures / "nvidia-smi_query_h100.csv").read_text())
    assert driver == "550.90.07"
    assert [r["index"] for r in rows] == [0, 1, 2]
    assert rows[1]["persistence_mode"] == 0
    assert rows[1]["ecc_corrected_volatile"] == 12
    assert rows[2]["ecc_uncorrected_volatile"] is None  # "[N/A]"
    assert rows[2]["clock_event_reasons"] == 0x24
    assert rows[0]["power_mw"] == 512340


def test_smi_q_reads_cuda_version_and_fabric_blocks(fixtures: Path) -> None:
    report = gpu_smi.parse_smi_q((fixtures / "nvidia-smi_q_h100.txt").read_text())
    assert report["cuda_version"] == "12.4"
    assert report["fabric"] == [
        {"state": 3, "status": 0},
        {"state": 2, "status": 0},
        {"state": 3, "status": "Insufficient Resources"},
    ]


def test_nvlink_status_marks_inactive_links(fixtures: Path) -> None:
    links = gpu_smi.parse_nvlink_status((fixtures / "nvidia-smi_nvlink_s.txt").read_text())
    assert sorted(links) == [0, 1, 2]
    assert links[0] == [1] * 18
    assert links[2] == [1] * 16 + [0, 0]


def test_smi_fallback_assembles_full_facts(fixtures: Path) -> None:
    run = replay_runner(
        {
            "nvidia-smi --query-gpu": "nvidia-smi_query_h100.csv",
            "nvidia-smi -q": "nvidia-smi_q_h100.txt",
            "nvidia-smi nvlink -s": "nvidia-smi_nvlink_s.txt",
        }
    )
    facts = facts_from_nvml(read_smi(run))
    assert facts.cuda_driver_version == "12.4"
    assert facts.devices[1].fabric_state == "in_progress"
    assert facts.devices[2].fabric_status == "Insufficient Resources"
    assert facts.devices[2].nvlink_states.count(False) == 2


def test_no_gpu_here_gives_a_reason_not_an_error(tmp_path: Path) -> None:
    if _nvml_works():
        pytest.skip("this machine has an NVIDIA driver")
    facts = probe_gpus(run=replay_runner({}), root=tmp_path, env={})
    assert not facts.available
    assert "no NVIDIA GPU found" in facts.unavailable_reason
    assert "nvidia-smi not found" in facts.unavailable_reason
