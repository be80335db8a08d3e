"""Xid errors (the NVIDIA driver's error codes) from the kernel log, when it is readable."""

from __future__ import annotations

import re

from kvserve.preflight.facts import KernelLogFacts, XidEvent
from kvserve.preflight.probes.commands import Runner, run_command

# NVRM: Xid (PCI:0000:18:00): 79, pid=0, name=python3, GPU has fallen off the bus.
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+),\s*(.*)")


def parse_xids(text: str) -> list[XidEvent]:
    events = []
    for line in text.splitlines():
        match = _XID.search(line)
        if match:
            events.append(XidEvent(match.group(1), int(match.group(2)), match.group(3).strip()))
    return events


def probe_kernel_log(run: Runner = run_command) -> KernelLogFacts:
    out = run(["dmesg"])
    if out is None:
        return KernelLogFacts(False, "dmesg not installed")
    if out.returncode != 0:
        detail = (out.stderr.strip().splitlines() or ["exit status " + str(out.returncode)])[0]
        return KernelLogFacts(False, f"kernel log not readable ({detail}); run as root")
    return KernelLogFacts(True, xids=parse_xids(out.stdout))
