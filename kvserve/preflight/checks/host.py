"""Host: /dev/shm, open-file and memlock limits, transparent huge pages, free disk and memory."""

from __future__ import annotations

from kvserve.preflight.checks.common import GIB, gib
from kvserve.preflight.facts import GpuFacts, HostFacts, IbFacts, ModelFacts
from kvserve.preflight.result import CheckResult, Status, skipped

NAMES = (
    "host: /dev/shm",
    "host: open files (ulimit -n)",
    "host: memlock (ulimit -l)",
    "host: transparent huge pages",
    "host: free disk",
    "host: free memory",
)
MIN_SHM = 1 * GIB
MIN_NOFILE = 65536
MIN_DISK = 20 * GIB


def check_shm(host: HostFacts, gpu: GpuFacts) -> CheckResult:
    if host.shm_bytes is None:
        return skipped(NAMES[0], "/dev/shm not mounted")
    expected = f">= {gib(MIN_SHM)} (NCCL and worker processes share memory through it)"
    if host.shm_bytes >= MIN_SHM:
        return CheckResult(NAMES[0], Status.PASS, gib(host.shm_bytes), expected)
    status = Status.FAIL if len(gpu.devices) > 1 else Status.WARN
    fix = "docker run --ipc=host (or --shm-size=32g); on a host: mount -o remount,size=32G /dev/shm"
    return CheckResult(NAMES[0], status, gib(host.shm_bytes), expected, fix)


def check_nofile(host: HostFacts) -> CheckResult:
    if host.nofile_soft is None:
        return skipped(NAMES[1], "limit not readable")
    observed = "unlimited" if host.nofile_soft < 0 else str(host.nofile_soft)
    expected = f">= {MIN_NOFILE} (one descriptor per client connection)"
    if host.nofile_soft < 0 or host.nofile_soft >= MIN_NOFILE:
        return CheckResult(NAMES[1], Status.PASS, observed, expected)
    fix = "ulimit -n 1048576; LimitNOFILE= in the systemd unit; docker --ulimit nofile=1048576"
    return CheckResult(NAMES[1], Status.WARN, observed, expected, fix)


def check_memlock(host: HostFacts, ib: IbFacts) -> CheckResult:
    if host.memlock_soft is None:
        return skipped(NAMES[2], "limit not readable")
    observed = "unlimited" if host.memlock_soft < 0 else f"{host.memlock_soft // 1024} KiB"
    if not ib.present:
        return CheckResult(NAMES[2], Status.PASS, observed, "any (no RDMA device)")
    expected = "unlimited (RDMA pins KV and NCCL buffers)"
    if host.memlock_soft < 0:
        return CheckResult(NAMES[2], Status.PASS, observed, expected)
    fix = "ulimit -l unlimited; LimitMEMLOCK=infinity; docker --ulimit memlock=-1"
    return CheckResult(NAMES[2], Status.FAIL, observed, expected, fix)


def check_thp(host: HostFacts) -> CheckResult:
    if host.thp_enabled is None:
        return skipped(NAMES[3], "/sys/kernel/mm/transparent_hugepage/enabled not readable")
    expected = "madvise or never"
    if host.thp_enabled == "always":
        fix = "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled (compaction stalls)"
        return CheckResult(NAMES[3], Status.WARN, "always", expected, fix)
    return CheckResult(NAMES[3], Status.PASS, host.thp_enabled, expected)


def check_disk(host: HostFacts) -> CheckResult:
    if host.disk_free_bytes is None:
        return skipped(NAMES[4], f"{host.disk_path} not readable")
    observed = f"{gib(host.disk_free_bytes)} free at {host.disk_path}"
    expected = f">= {gib(MIN_DISK)} (logs, compile caches)"
    if host.disk_free_bytes >= MIN_DISK:
        return CheckResult(NAMES[4], Status.PASS, observed, expected)
    return CheckResult(NAMES[4], Status.WARN, observed, expected, "free space on that filesystem")


def check_memory(host: HostFacts, model: ModelFacts | None) -> CheckResult:
    if host.mem_available_bytes is None:
        return skipped(NAMES[5], "/proc/meminfo not readable")
    weights = model.weight_bytes if model and model.weight_bytes else None
    need = max(weights or 0, 8 * GIB)
    expected = f">= {gib(need)}" + (" (the weights pass through page cache)" if weights else "")
    observed = f"{gib(host.mem_available_bytes)} available"
    if host.mem_total_bytes:
        observed += f" of {gib(host.mem_total_bytes)}"
    if host.mem_available_bytes >= need:
        return CheckResult(NAMES[5], Status.PASS, observed, expected)
    fix = "free host memory (other jobs, page cache) or load from faster storage"
    return CheckResult(NAMES[5], Status.WARN, observed, expected, fix)


def check_host(
    host: HostFacts, gpu: GpuFacts, ib: IbFacts, model: ModelFacts | None
) -> list[CheckResult]:
    return [
        check_shm(host, gpu),
        check_nofile(host),
        check_memlock(host, ib),
        check_thp(host),
        check_disk(host),
        check_memory(host, model),
    ]
