from __future__ import annotations

import json
from pathlib import Path

from conftest import replay_runner

from kvserve.preflight.checks.fabric import check_fabric
from kvserve.preflight.probes.fabric_manager import (
    parse_fm_version,
    parse_systemctl_status,
    probe_fabric_manager,
)
from kvserve.preflight.probes.gpu_nvml import facts_from_nvml
from kvserve.preflight.result import Status


def _rows(fixtures: Path, gpu_file: str, status_file: str, version_file: str) -> dict:
    gpu = facts_from_nvml(json.loads((fixtures / gpu_file).read_text()))
    gpu.nvswitch_count = 4
    recordings = {"systemctl status": status_file}
    if version_file:
        recordings["nv-fabricmanager"] = version_file
    fm = probe_fabric_manager(replay_runner(recordings))
    return {r.name: r for r in check_fabric(gpu, fm)}


def test_parse_status_and_version(fixtures: Path) -> None:
    ok = parse_systemctl_status((fixtures / "fabricmanager_status_ok.txt").read_text())
    assert ok == (True, "active (running)", [])
    bad = parse_systemctl_status((fixtures / "fabricmanager_status_mismatch.txt").read_text())
    assert bad[1] == "failed (Result: exit-code)"
    assert "550.54.15 don't match with driver version 550.90.07" in bad[2][0]
    missing = parse_systemctl_status((fixtures / "fabricmanager_status_missing.txt").read_text())
    assert missing[0] is False
    version = (fixtures / "fabricmanager_version_550.90.07.txt").read_text()
    assert parse_fm_version(version) == "550.90.07"


def test_matching_fabric_manager_passes(fixtures: Path) -> None:
    rows = _rows(
        fixtures,
        "nvml_hgx_h100_healthy.json",
        "fabricmanager_status_ok.txt",
        "fabricmanager_version_550.90.07.txt",
    )
    assert {r.status for r in rows.values()} == {Status.PASS}
    assert rows["nvlink: links active"].observed == "144 links active"


def test_version_mismatch_fails_with_the_fix(fixtures: Path) -> None:
    rows = _rows(
        fixtures,
        "nvml_hgx_h100_healthy.json",
        "fabricmanager_status_mismatch.txt",
        "fabricmanager_version_550.54.15.txt",
    )
    assert rows["fabric manager: service"].status is Status.FAIL
    version = rows["fabric manager: version"]
    assert version.status is Status.FAIL
    assert version.observed == "550.54.15" and version.expected == "== driver 550.90.07"
    assert "nvidia-fabricmanager 550.90.07" in version.fix


def test_missing_service_and_bad_fabric_state(fixtures: Path) -> None:
    rows = _rows(fixtures, "nvml_hgx_h200_degraded.json", "fabricmanager_status_missing.txt", "")
    assert rows["fabric manager: service"].status is Status.FAIL
    assert rows["fabric: state"].observed == "GPU7: in_progress, success"
    assert rows["nvlink: links active"].observed == "GPU6: 2 of 18 inactive"


def test_pcie_only_node_skips_fabric_manager(fixtures: Path) -> None:
    gpu = facts_from_nvml(json.loads((fixtures / "nvml_hgx_h100_healthy.json").read_text()))
    for d in gpu.devices:
        d.fabric_state, d.nvlink_states = "not_supported", []
    fm = probe_fabric_manager(replay_runner({}))
    rows = check_fabric(gpu, fm)
    assert all(r.status is Status.SKIP for r in rows)
    assert "no NVSwitch" in rows[0].observed
