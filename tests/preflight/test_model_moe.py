"""Preflight's fit check on a mixture-of-experts checkpoint: every expert is held in memory,
only the routed ones are read per token."""

from __future__ import annotations

from pathlib import Path

from model_factory import MOE_TINY
from safetensors import safe_open

from kvserve.preflight.checks.model import check_model
from kvserve.preflight.facts import GpuDevice, GpuFacts
from kvserve.preflight.options import PreflightOptions
from kvserve.preflight.probes.model_files import probe_model


def test_moe_weights_held_and_read_per_token(tiny_model_dir) -> None:  # noqa: ANN001
    arch = "Qwen3MoeForCausalLM"
    path = Path(tiny_model_dir(arch, **MOE_TINY[arch]))
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        sizes = {k: f.get_slice(k).get_shape() for k in f.keys()}  # noqa: SIM118
    expert = sum(4 * s[0] * s[1] for k, s in sizes.items() if ".experts." in k)  # fp32
    model = probe_model(path)
    assert model.problems == []
    assert (model.num_experts, model.experts_per_token) == (8, 2)
    assert model.expert_bytes == expert > 0
    assert model.active_weight_bytes == model.weight_bytes - expert * 6 // 8
    gpu = GpuFacts(source="nvml")
    gpu.devices = [GpuDevice(0, "NVIDIA H200", memory_total_mib=143771)]
    rows = {r.name: r for r in check_model(model, gpu, PreflightOptions())}
    assert "mixture of 8 experts, 2 per token" in rows["model: memory fit"].observed
