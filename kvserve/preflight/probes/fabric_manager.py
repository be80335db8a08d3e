"""NVIDIA Fabric Manager (NVSwitch systems): its systemd unit, its version, its complaints."""

from __future__ import annotations

import re

from kvserve.preflight.facts import FabricManagerFacts
from kvserve.preflight.probes.commands import Runner, run_command

UNIT = "nvidia-fabricmanager"
# Lines FM writes when it refuses to run, e.g. a driver/FM version mismatch.
_FM_ERRORS = re.compile(r"don't match|do not match|failed|error", re.I)


def parse_systemctl_status(text: str) -> tuple[bool, str | None, list[str]]:
    """-> (unit installed, "Active:" value, FM log lines that report errors)."""
    if "could not be found" in text or not text.strip():
        return False, None, []
    active = re.search(r"^\s*Active:\s*(.+?)(?:\s+since .*)?$", text, re.M)
    errors = [
        line.split("]: ", 1)[-1].strip()
        for line in text.splitlines()
        if "nv-fabricmanager[" in line and _FM_ERRORS.search(line)
    ]
    return True, active.group(1).strip() if active else None, errors


def parse_fm_version(text: str) -> str | None:
    """`nv-fabricmanager --version` -> "Fabric Manager version is : 550.54.15"."""
    match = re.search(r"version is\s*:\s*(\S+)", text)
    return match.group(1) if match else None


def probe_fabric_manager(run: Runner = run_command) -> FabricManagerFacts:
    status = run(["systemctl", "status", "--no-pager", "-n", "20", UNIT])
    version_out = run(["nv-fabricmanager", "--version"])
    version = parse_fm_version(version_out.stdout) if version_out else None
    if status is None:
        reason = "systemctl not available (container?)"
        return FabricManagerFacts(version_out is not None, version=version, reason=reason)
    installed, active, errors = parse_systemctl_status(status.stdout + status.stderr)
    installed = installed or version_out is not None
    return FabricManagerFacts(installed, active, version, errors)
