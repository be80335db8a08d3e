from __future__ import annotations

from pathlib import Path

from conftest import replay_runner

from kvserve.preflight.checks.ib import check_ib
from kvserve.preflight.checks.kmods import check_modules
from kvserve.preflight.facts import IbFacts
from kvserve.preflight.probes.kmods import probe_modules
from kvserve.preflight.probes.sysfs_ib import probe_ib
from kvserve.preflight.result import Status


def test_sysfs_tree_reads_ports_firmware_and_counters(fixtures: Path) -> None:
    ib = probe_ib(fixtures / "roots/hgx_ib", replay_runner({"ofed_info -s": "ofed_info_s.txt"}))
    assert [d.name for d in ib.devices] == ["mlx5_0", "mlx5_1"]
    assert ib.ofed_version == "MLNX_OFED_LINUX-23.10-1.1.9.0"
    p0, p1 = ib.devices[0].ports[0], ib.devices[1].ports[0]
    assert (p0.state, p0.phys_state, p0.rate, p0.link_layer) == (
        "ACTIVE",
        "LinkUp",
        "400 Gb/sec (4X NDR)",
        "InfiniBand",
    )
    assert (p1.state, p1.phys_state, p1.link_downed) == ("DOWN", "Polling", 7)
    assert ib.devices[1].fw_ver == "28.41.1000"


def test_ib_checks_flag_down_port_firmware_skew_and_flaps(fixtures: Path) -> None:
    ib = probe_ib(fixtures / "roots/hgx_ib", replay_runner({"ofed_info -s": "ofed_info_s.txt"}))
    rows = {r.name: r for r in check_ib(ib)}
    assert rows["ib: port state"].status is Status.FAIL
    assert rows["ib: port state"].observed == "mlx5_1:1 DOWN/Polling"
    assert rows["ib: rate and link layer"].observed == "2 x 400 Gb/sec (4X NDR), InfiniBand"
    assert rows["ib: firmware"].status is Status.WARN
    assert "28.39.2048, 28.41.1000" in rows["ib: firmware"].observed
    assert rows["ib: OFED"].status is Status.PASS
    assert rows["ib: link flaps"].status is Status.WARN
    assert "mlx5_1:1 downed 7" in rows["ib: link flaps"].observed


def test_no_ib_skips_every_row(tmp_path: Path) -> None:
    rows = check_ib(probe_ib(tmp_path, replay_runner({})))
    assert {r.status for r in rows} == {Status.SKIP}


def test_nouveau_fails_and_peermem_missing_warns_when_ib_present(fixtures: Path) -> None:
    ib = probe_ib(fixtures / "roots/hgx_ib", replay_runner({}))
    hgx = {r.name: r for r in check_modules(probe_modules(fixtures / "roots/hgx_ib"), ib)}
    assert hgx["kmod: nouveau"].status is Status.PASS
    assert hgx["kmod: nvidia_peermem"].status is Status.WARN
    workstation = probe_modules(fixtures / "roots/pcie_nouveau")
    rows = {r.name: r for r in check_modules(workstation, IbFacts())}
    assert rows["kmod: nouveau"].status is Status.FAIL
    assert "blacklist nouveau" in rows["kmod: nouveau"].fix
    assert rows["kmod: nvidia_peermem"].status is Status.SKIP


def test_unreadable_proc_modules_is_skipped(tmp_path: Path) -> None:
    rows = check_modules(probe_modules(tmp_path), IbFacts())
    assert {r.status for r in rows} == {Status.SKIP}
    assert "not readable" in rows[0].observed
