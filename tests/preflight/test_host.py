from __future__ import annotations

from pathlib import Path

from kvserve.preflight.checks.host import check_host
from kvserve.preflight.facts import GpuFacts, HostFacts, IbFacts
from kvserve.preflight.probes.host import parse_meminfo, parse_thp, probe_host
from kvserve.preflight.result import Status

NO_GPU = GpuFacts(source=None)


def test_probe_reads_meminfo_and_thp_from_a_root(fixtures: Path) -> None:
    host = probe_host(fixtures / "roots/pcie_nouveau", disk_path=fixtures / "missing/dir")
    assert host.thp_enabled == "always"
    assert host.mem_available_bytes == 3145728 * 1024
    assert host.disk_path == str(fixtures)  # nearest existing parent
    assert host.disk_free_bytes is not None and host.disk_free_bytes > 0


def test_parsers() -> None:
    assert parse_thp("always [madvise] never") == "madvise"
    assert parse_meminfo("MemTotal:  1024 kB\nHugePages_Total: 0\n") == {"MemTotal": 1024 * 1024}


def test_small_shm_thp_always_low_memory_and_memlock_with_ib() -> None:
    host = HostFacts(
        shm_bytes=64 * 2**20,
        nofile_soft=1024,
        memlock_soft=65536,
        thp_enabled="always",
        disk_path="/",
        disk_free_bytes=2**30,
        mem_available_bytes=2**30,
        mem_total_bytes=2**34,
    )
    multi = GpuFacts(source="nvml")
    multi.devices = [object(), object()]  # type: ignore[list-item]
    from kvserve.preflight.facts import IbDevice

    ib = IbFacts(devices=[IbDevice("mlx5_0", None, None, None)])
    rows = {r.name: r for r in check_host(host, multi, ib, None)}
    assert (
        rows["host: /dev/shm"].status is Status.FAIL and "--ipc=host" in rows["host: /dev/shm"].fix
    )
    assert rows["host: open files (ulimit -n)"].status is Status.WARN
    assert rows["host: memlock (ulimit -l)"].status is Status.FAIL
    assert rows["host: transparent huge pages"].status is Status.WARN
    assert rows["host: free disk"].status is Status.WARN
    assert rows["host: free memory"].status is Status.WARN


def test_this_machine_host_checks_run() -> None:
    rows = check_host(probe_host(), NO_GPU, IbFacts(), None)
    assert len(rows) == 6
    assert all(r.observed for r in rows)
