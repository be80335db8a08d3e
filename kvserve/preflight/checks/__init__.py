"""Checks: pure functions of facts (and the options) that return report rows."""

from __future__ import annotations

from kvserve.preflight.checks import (
    cuda,
    fabric,
    gpu,
    host,
    ib,
    kmods,
    model,
    nccl,
    settings,
    thermal,
)
from kvserve.preflight.facts import NodeFacts
from kvserve.preflight.options import PreflightOptions
from kvserve.preflight.result import CheckResult


def run_checks(facts: NodeFacts, opts: PreflightOptions) -> list[CheckResult]:
    return [
        *gpu.check_gpus(facts.gpu, facts.kernel_log, opts),
        *fabric.check_fabric(facts.gpu, facts.fabric_manager),
        *cuda.check_cuda(facts.gpu, facts.torch, facts.model, opts),
        *kmods.check_modules(facts.modules, facts.ib),
        *ib.check_ib(facts.ib),
        *nccl.check_nccl(facts.nccl, facts.ib, opts),
        *thermal.check_thermals(facts.gpu),
        *host.check_host(facts.host, facts.gpu, facts.ib, facts.model),
        *model.check_model(facts.model, facts.gpu, opts),
        *settings.check_settings(facts.settings),
    ]
