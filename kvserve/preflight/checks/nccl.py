"""NCCL (`--nccl`): the all-reduce ran and gave the right sum; its transport; bus bandwidth."""

from __future__ import annotations

from kvserve.preflight.facts import IbFacts, NcclFacts
from kvserve.preflight.options import PreflightOptions
from kvserve.preflight.result import CheckResult, Status, skipped

RUN, TRANSPORT = "nccl: all-reduce", "nccl: transport"


def check_run(nccl: NcclFacts) -> CheckResult:
    expected = "completes with the right sum"
    if not nccl.ok:
        fix = "rerun with NCCL_DEBUG=INFO and read the WARN lines; check NCCL_SOCKET_IFNAME/IB_HCA"
        return CheckResult(RUN, Status.FAIL, nccl.reason or "failed", expected, fix)
    if nccl.ranks == 1:
        # one rank moves no data between GPUs: its "bandwidth" is a local copy, not a link
        observed = f"1 rank, NCCL {nccl.version}: ran; no inter-GPU traffic, bandwidth n/a"
        return CheckResult(RUN, Status.PASS, observed, expected)
    size = nccl.size_bytes / 2**20
    observed = (
        f"{nccl.ranks} ranks, NCCL {nccl.version}, {size:.0f} MiB in {nccl.time_s * 1e3:.2f} ms"
    )
    observed += f", algbw {nccl.algbw_gbs:.1f} GB/s, busbw {nccl.busbw_gbs:.1f} GB/s"
    return CheckResult(RUN, Status.PASS, observed, expected)


def check_transport(nccl: NcclFacts, ib: IbFacts) -> CheckResult:
    via = ", ".join(nccl.transports) or "none (one rank)"
    devices = f" [{', '.join(nccl.net_devices)}]" if nccl.net_devices else ""
    observed = f"intra: {via}; network: {nccl.network or 'unknown'}{devices}"
    if ib.present:
        expected = "network IB (InfiniBand/RoCE is present)"
        if nccl.network != "IB":
            fix = (
                "NCCL fell back to sockets: check NCCL_IB_DISABLE is unset, NCCL_IB_HCA matches "
                "ibv_devices, the IB ports are ACTIVE and libibverbs is visible in the container"
            )
            return CheckResult(TRANSPORT, Status.FAIL, observed, expected, fix)
        return CheckResult(TRANSPORT, Status.PASS, observed, expected)
    expected = "P2P (NVLink/PCIe) inside the host"
    if "SHM" in nccl.transports and not any(t.startswith("P2P") for t in nccl.transports):
        fix = "P2P is off (NCCL_P2P_DISABLE? IOMMU/ACS on?): NVLink is unused"
        return CheckResult(TRANSPORT, Status.WARN, observed, expected, fix)
    return CheckResult(TRANSPORT, Status.PASS, observed, expected)


def check_nccl(nccl: NcclFacts, ib: IbFacts, opts: PreflightOptions) -> list[CheckResult]:
    if not opts.nccl:
        return [skipped(RUN, "not run: add --nccl"), skipped(TRANSPORT, "not run: add --nccl")]
    if not nccl.ran:
        return [skipped(RUN, nccl.reason), skipped(TRANSPORT, nccl.reason)]
    run = check_run(nccl)
    if run.status is Status.FAIL and not nccl.transports and nccl.network is None:
        return [run, skipped(TRANSPORT, "the all-reduce printed no transport")]
    return [run, check_transport(nccl, ib)]
