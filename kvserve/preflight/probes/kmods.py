"""Loaded kernel modules, from /proc/modules."""

from __future__ import annotations

from pathlib import Path

from kvserve.preflight.facts import ModuleFacts


def parse_proc_modules(text: str) -> set[str]:
    return {line.split()[0] for line in text.splitlines() if line.strip()}


def probe_modules(root: Path = Path("/")) -> ModuleFacts:
    path = root / "proc" / "modules"
    try:
        text = path.read_text()
    except OSError as exc:
        return ModuleFacts(False, reason=f"{path} not readable ({exc.strerror})")
    if not text.strip():
        return ModuleFacts(False, reason=f"{path} is empty (a sandboxed kernel?)")
    return ModuleFacts(True, parse_proc_modules(text))
