"""InfiniBand / RoCE: port state, rate and link layer, firmware consistency, OFED, link flaps."""

from __future__ import annotations

from collections import Counter, defaultdict

from kvserve.preflight.checks.common import join
from kvserve.preflight.facts import IbFacts, IbPort
from kvserve.preflight.result import CheckResult, Status, skipped

NAMES = ("ib: port state", "ib: rate and link layer", "ib: firmware", "ib: OFED", "ib: link flaps")


def _ports(ib: IbFacts) -> list[IbPort]:
    return [p for d in ib.devices for p in d.ports]


def check_ports(ib: IbFacts) -> CheckResult:
    ports = _ports(ib)
    bad = [
        f"{p.device}:{p.port} {p.state}/{p.phys_state}"
        for p in ports
        if p.state != "ACTIVE" or p.phys_state != "LinkUp"
    ]
    expected = "ACTIVE / LinkUp"
    if not bad:
        return CheckResult(NAMES[0], Status.PASS, f"{len(ports)} ports ACTIVE/LinkUp", expected)
    if any("INIT/LinkUp" in b for b in bad):
        fix = "link up but INIT: no subnet manager answers; start opensm/UFM on the fabric"
    else:
        fix = (
            "check the cable and switch port (ibstat, mlxlink -d <dev>); `ip link set up` for RoCE"
        )
    return CheckResult(NAMES[0], Status.FAIL, join(bad), expected, fix)


def check_rate(ib: IbFacts) -> CheckResult:
    kinds = Counter(f"{p.rate}, {p.link_layer}" for p in _ports(ib))
    observed = "; ".join(f"{n} x {kind}" for kind, n in kinds.most_common())
    if len(kinds) > 1:
        fix = "ports differ: NCCL runs at the slowest rail; check cables/switch speed settings"
        return CheckResult(NAMES[1], Status.WARN, observed, "one rate on every port", fix)
    return CheckResult(NAMES[1], Status.PASS, observed, "one rate on every port")


def check_firmware(ib: IbFacts) -> CheckResult:
    by_type: dict[str, set[str]] = defaultdict(set)
    for d in ib.devices:
        by_type[d.board_id or d.hca_type or "unknown"].add(d.fw_ver or "unknown")
    observed = "; ".join(f"{t}: {', '.join(sorted(v))}" for t, v in sorted(by_type.items()))
    expected = "one firmware per board type, the one OFED's release notes name"
    if any(len(v) > 1 for v in by_type.values()):
        fix = "flash every HCA of a type to one firmware: mlxfwmanager --online -u (then reboot)"
        return CheckResult(NAMES[2], Status.WARN, observed, expected, fix)
    return CheckResult(NAMES[2], Status.PASS, observed, expected)


def check_ofed(ib: IbFacts) -> CheckResult:
    if ib.ofed_version is None:
        return skipped(NAMES[3], "ofed_info not installed: in-box rdma-core driver")
    expected = "installed; firmware matches its release notes"
    return CheckResult(NAMES[3], Status.PASS, ib.ofed_version, expected)


def check_flaps(ib: IbFacts) -> CheckResult:
    flapping = [
        f"{p.device}:{p.port} downed {p.link_downed}, recovered {p.link_error_recovery}"
        for p in _ports(ib)
        if (p.link_downed or 0) > 0 or (p.link_error_recovery or 0) > 0
    ]
    expected = "link_downed = link_error_recovery = 0 since boot"
    if flapping:
        fix = "a flapping link: reseat/replace the cable or transceiver; check the switch port"
        return CheckResult(NAMES[4], Status.WARN, join(flapping), expected, fix)
    return CheckResult(NAMES[4], Status.PASS, "no link downs or error recoveries", expected)


def check_ib(ib: IbFacts) -> list[CheckResult]:
    if not ib.present:
        return [skipped(name, ib.reason) for name in NAMES]
    return [check_ports(ib), check_rate(ib), check_firmware(ib), check_ofed(ib), check_flaps(ib)]
