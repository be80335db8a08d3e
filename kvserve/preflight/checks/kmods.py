"""Kernel modules: nouveau must not be loaded; nvidia_peermem for GPUDirect RDMA when IB exists."""

from __future__ import annotations

from kvserve.preflight.facts import IbFacts, ModuleFacts
from kvserve.preflight.result import CheckResult, Status, skipped

NOUVEAU, PEERMEM = "kmod: nouveau", "kmod: nvidia_peermem"


def check_modules(mods: ModuleFacts, ib: IbFacts) -> list[CheckResult]:
    if not mods.readable:
        return [skipped(NOUVEAU, mods.reason), skipped(PEERMEM, mods.reason)]
    rows = []
    if "nouveau" in mods.loaded:
        fix = (
            "printf 'blacklist nouveau\\noptions nouveau modeset=0\\n' > "
            "/etc/modprobe.d/blacklist-nouveau.conf; update-initramfs -u; reboot"
        )
        rows.append(CheckResult(NOUVEAU, Status.FAIL, "loaded", "not loaded", fix))
    else:
        rows.append(CheckResult(NOUVEAU, Status.PASS, "not loaded", "not loaded"))
    if not ib.present:
        rows.append(skipped(PEERMEM, "no InfiniBand/RoCE device"))
    elif "nvidia_peermem" in mods.loaded:
        rows.append(CheckResult(PEERMEM, Status.PASS, "loaded", "loaded (IB present)"))
    else:
        fix = "modprobe nvidia_peermem (add it to /etc/modules-load.d/); or use NCCL's DMA-BUF"
        rows.append(CheckResult(PEERMEM, Status.WARN, "not loaded", "loaded (IB present)", fix))
    return rows
