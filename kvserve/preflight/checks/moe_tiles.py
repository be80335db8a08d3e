"""Model (`--model`, a mixture of experts): does this GPU have tuned tiles for the experts'
grouped GEMMs at the shape each rank runs (``kvserve/kernels/moe_configs``)? Without them the
engine runs its heuristic tile, which the H200's tuning beat by up to 1.2-1.7x at some batch
sizes (README, "Tuned tiles")."""

from __future__ import annotations

from pathlib import Path

from kvserve.kernels.moe_tiles import CONFIG_DIR_ENV, MoeShape, active_table_path, tuned_kinds
from kvserve.preflight.facts import GpuFacts, ModelFacts
from kvserve.preflight.result import CheckResult, Status, skipped

NAME = "model: MoE tiles"


def expert_shape(model: ModelFacts, tp: int) -> MoeShape | None:
    """The experts' shape one rank runs (experts shard along their intermediate size); its
    kind is the table's to say."""
    inter, hidden = model.expert_intermediate_size, model.hidden_size
    if not (model.num_experts and model.experts_per_token and inter and hidden):
        return None
    return MoeShape("any", model.num_experts, 2 * inter // tp, hidden, model.experts_per_token)


def check_moe_tiles(model: ModelFacts, gpu: GpuFacts, tp: int) -> CheckResult:
    shape = expert_shape(model, tp)
    if shape is None:
        return skipped(NAME, "the config gives no expert count, top-k or intermediate size")
    dims = shape.dims()
    names = sorted({d.name for d in gpu.devices})
    if not names:
        return skipped(NAME, f"no GPU to look up tuned tiles for ({dims})")
    expected = f"tuned tiles for {dims} in kvserve/kernels/moe_configs/<GPU>.json"
    found, missing = [], []
    for name in names:
        try:
            kinds = tuned_kinds(name, shape)  # a malformed table raises, as in the engine
        except ValueError as exc:
            fix = f"restore or re-tune {active_table_path(name)}"
            return CheckResult(NAME, Status.FAIL, str(exc), expected, fix)
        if kinds:
            found.append(f"{name}: {', '.join(kinds)}")
        else:
            missing.append(name)
    if not missing:
        return CheckResult(NAME, Status.PASS, f"{'; '.join(found)} at {dims}", expected)
    source = model.path if Path(model.path).is_dir() else "<a directory with its config.json>"
    fix = (
        f"the heuristic tile runs instead; tune on this GPU from a kvserve checkout: python -m "
        f"benchmarks.moe_tune --models {source} --formats <bf16|fp8|fp8-channel|nvfp4|mxfp4> "
        f"--tp {tp} --table DIR, then run with {CONFIG_DIR_ENV}=DIR"
    )
    observed = f"no entry for {dims} on {', '.join(missing)}" + "".join(f"; {f}" for f in found)
    return CheckResult(NAME, Status.WARN, observed, expected, fix)
