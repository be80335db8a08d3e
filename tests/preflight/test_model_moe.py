"""Preflight's fit check on a mixture-of-experts checkpoint: every expert is held in memory,
only the routed ones are read per token."""

from __future__ import annotations

from pathlib import Path

from model_factory import MOE_TINY, make_tiny_gguf
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


def test_gguf_moe_experts_and_multi_token_prediction_block(tmp_path: Path) -> None:
    """A glm4moe GGUF as llama.cpp writes it: the stacked ``ffn_*_exps`` of the decoder's
    blocks are the expert bytes; the multi-token-prediction block that ``block_count``
    includes is not a layer."""
    import gguf

    arch = "Glm4MoeForCausalLM"
    path, _ = make_tiny_gguf(arch, tmp_path, "F32", nextn_layers=1, **MOE_TINY[arch])
    model = probe_model(path)
    assert model.problems == [] and model.architecture == arch
    assert (model.num_layers, model.num_experts, model.experts_per_token) == (2, 8, 3)
    stacked = [t for t in gguf.GGUFReader(path).tensors if "_exps." in t.name]
    decoder = [t for t in stacked if not t.name.startswith("blk.2.")]
    assert (len(stacked), len(decoder)) == (5, 3)  # layer 1's three, the MTP block's two
    assert model.expert_bytes == sum(int(t.n_bytes) for t in decoder) > 0


def test_preflight_names_every_gguf_architecture_the_loader_reads() -> None:
    """Preflight keeps its own table (it must not import torch); it must not fall behind."""
    from kvserve.loader.architectures import GGUF_ARCHITECTURES as LOADED
    from kvserve.preflight.probes.model_files import GGUF_ARCHITECTURES

    assert GGUF_ARCHITECTURES == LOADED
