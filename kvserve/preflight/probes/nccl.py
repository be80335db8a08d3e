"""NCCL: run a short all-reduce in a subprocess and read the transport from its INFO log."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from kvserve.preflight.facts import NcclFacts
from kvserve.preflight.probes.nccl_worker import RESULT_TAG

_VIA = re.compile(r" via (\S+)")


def _transport(via: str) -> str:
    """ "P2P/CUMEM/read" -> "P2P/CUMEM", "SHM/direct/direct" -> "SHM", "NET/IB/0/GDRDMA" -> ..."""
    parts = via.split("/")
    if parts[0] == "SHM":
        return "SHM"
    name = "/".join(parts[:2])
    return f"{name}/GDRDMA" if "GDRDMA" in parts else name


def _devices(log: str) -> list[str]:
    found: list[str] = []
    for match in re.finditer(r"NET/(?:IB|Socket) : Using (.*)", log):
        listing = match.group(1).split(";")[0]
        found += [d for d in re.findall(r"\[\d+\]([^\s;]+)", listing) if d not in found]
    return found


def parse_nccl_log(log: str) -> NcclFacts:
    """Everything the INFO log says about version, network and transports; no timing."""
    facts = NcclFacts(ran=True)
    version = re.search(r"NCCL version (\S+)", log)
    network = re.findall(r"Using network (\w+)", log)
    nodes = re.search(r"nNodes (\d+)", log)
    facts.version = version.group(1) if version else None
    facts.network = network[-1] if network else None
    facts.nodes = int(nodes.group(1)) if nodes else None
    facts.net_devices = _devices(log)
    transports = [_transport(m.group(1)) for m in _VIA.finditer(log)]
    facts.transports = sorted(set(transports))
    facts.warnings = [line.strip() for line in log.splitlines() if "NCCL WARN" in line][:5]
    return facts


def apply_result(facts: NcclFacts, log: str) -> NcclFacts:
    """Fill ranks, correctness and bandwidth from the worker's result line, if it printed one."""
    line = next((x for x in log.splitlines() if x.startswith(RESULT_TAG)), None)
    if line is None:
        return facts
    result = json.loads(line[len(RESULT_TAG) :])
    facts.ranks, facts.ok = result["ranks"], bool(result["correct"])
    facts.size_bytes, facts.time_s = result["size_bytes"], result["time_s"]
    facts.algbw_gbs = facts.size_bytes / facts.time_s / 1e9
    facts.busbw_gbs = facts.algbw_gbs * 2 * (facts.ranks - 1) / facts.ranks
    return facts


def nccl_env(base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET,ENV")
    # NVLink multicast (NVLS) can wedge a shared host's GPUs; never let this probe use it.
    env["NCCL_NVLS_ENABLE"] = "0"
    env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
    return env


def probe_nccl(size_mb: int = 256, iters: int = 20, timeout: float = 240.0) -> NcclFacts:
    argv = [sys.executable, "-m", "kvserve.preflight.probes.nccl_worker"]
    argv += ["--size-mb", str(size_mb), "--iters", str(iters)]
    try:
        proc = subprocess.run(argv, env=nccl_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return NcclFacts(ran=True, reason=f"all-reduce did not finish in {timeout:.0f} s (hung)")
    log = proc.stdout + proc.stderr
    facts = apply_result(parse_nccl_log(log), log)
    if proc.returncode != 0 or not facts.ok:
        tail = facts.warnings or log.strip().splitlines()[-3:] or ["no output"]
        facts.ok = False
        facts.reason = f"all-reduce failed (exit {proc.returncode}): {tail[-1][:200]}"
    return facts
