"""InfiniBand / RoCE devices from /sys/class/infiniband, and the OFED version (`ofed_info -s`)."""

from __future__ import annotations

from pathlib import Path

from kvserve.preflight.facts import IbDevice, IbFacts, IbPort
from kvserve.preflight.probes.commands import Runner, run_command


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _counter(port_dir: Path, name: str) -> int | None:
    text = _read(port_dir / "counters" / name)
    return int(text) if text is not None and text.isdigit() else None


def _label(text: str | None) -> str:
    # sysfs writes "4: ACTIVE" and "5: LinkUp"; keep the name
    return "unknown" if text is None else text.split(":", 1)[-1].strip()


def read_port(device: str, port_dir: Path) -> IbPort:
    return IbPort(
        device=device,
        port=int(port_dir.name),
        state=_label(_read(port_dir / "state")),
        phys_state=_label(_read(port_dir / "phys_state")),
        rate=_read(port_dir / "rate") or "unknown",
        link_layer=_read(port_dir / "link_layer") or "unknown",
        link_downed=_counter(port_dir, "link_downed"),
        link_error_recovery=_counter(port_dir, "link_error_recovery"),
        symbol_error=_counter(port_dir, "symbol_error"),
    )


def read_devices(root: Path) -> list[IbDevice]:
    base = root / "sys" / "class" / "infiniband"
    devices = []
    for dev_dir in sorted(base.iterdir()) if base.is_dir() else []:
        ports_dir = dev_dir / "ports"
        port_dirs = (
            sorted(ports_dir.iterdir(), key=lambda p: int(p.name)) if ports_dir.is_dir() else []
        )
        devices.append(
            IbDevice(
                name=dev_dir.name,
                fw_ver=_read(dev_dir / "fw_ver"),
                hca_type=_read(dev_dir / "hca_type"),
                board_id=_read(dev_dir / "board_id"),
                ports=[read_port(dev_dir.name, p) for p in port_dirs],
            )
        )
    return devices


def parse_ofed_info(text: str) -> str | None:
    """`ofed_info -s` prints one line such as "MLNX_OFED_LINUX-23.10-1.1.9.0:"."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line.rstrip(":") or None


def probe_ib(root: Path = Path("/"), run: Runner = run_command) -> IbFacts:
    devices = read_devices(root)
    out = run(["ofed_info", "-s"])
    ofed = parse_ofed_info(out.stdout) if out and out.returncode == 0 else None
    reason = "" if devices else "no devices under /sys/class/infiniband"
    return IbFacts(devices, ofed, reason)
