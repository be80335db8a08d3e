"""Host limits that bite LLM serving: /dev/shm, open files, memlock, THP, disk and memory."""

from __future__ import annotations

import os
import re
import resource
import shutil
from pathlib import Path

from kvserve.preflight.facts import HostFacts


def _statvfs_bytes(path: Path) -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo "MemAvailable:   12345 kB" -> {"MemAvailable": bytes}."""
    out = {}
    for match in re.finditer(r"^(\w+):\s+(\d+) kB$", text, re.M):
        out[match.group(1)] = int(match.group(2)) * 1024
    return out


def parse_thp(text: str) -> str | None:
    """ "always [madvise] never" -> "madvise"."""
    match = re.search(r"\[(\w+)\]", text)
    return match.group(1) if match else None


def _soft_limit(which: int) -> int | None:
    try:
        soft, _ = resource.getrlimit(which)
    except (OSError, ValueError):
        return None
    return -1 if soft == resource.RLIM_INFINITY else soft


def _nearest_existing(path: Path) -> Path:
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path.parent if path.is_file() else path


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def probe_host(root: Path = Path("/"), disk_path: Path | None = None) -> HostFacts:
    meminfo = parse_meminfo(_read(root / "proc" / "meminfo"))
    disk = _nearest_existing(disk_path or Path.cwd())
    try:
        free = shutil.disk_usage(disk).free
    except OSError:
        free = None
    return HostFacts(
        shm_bytes=_statvfs_bytes(root / "dev" / "shm"),
        nofile_soft=_soft_limit(resource.RLIMIT_NOFILE),
        memlock_soft=_soft_limit(resource.RLIMIT_MEMLOCK),
        thp_enabled=parse_thp(_read(root / "sys/kernel/mm/transparent_hugepage/enabled")),
        disk_path=str(disk),
        disk_free_bytes=free,
        mem_available_bytes=meminfo.get("MemAvailable"),
        mem_total_bytes=meminfo.get("MemTotal"),
    )
