"""Preflight's checks of a mixture-of-experts checkpoint: every expert is held in memory, only
the routed ones are read per token; tuned tiles for the experts' shape on this GPU, or not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from model_factory import MOE_TINY, make_tiny_gguf
from safetensors import safe_open

from kvserve.kernels import moe_tiles
from kvserve.preflight.checks.model import check_model
from kvserve.preflight.facts import GpuDevice, GpuFacts
from kvserve.preflight.options import PreflightOptions
from kvserve.preflight.probes.model_files import probe_model
from kvserve.preflight.result import Status

TILE = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3}


def _gpu(name: str = "NVIDIA H200") -> GpuFacts:
    gpu = GpuFacts(source="nvml")
    gpu.devices = [GpuDevice(0, name, memory_total_mib=143771)]
    return gpu


def _tiles_row(model, gpu: GpuFacts, tp: int = 1):  # noqa: ANN001, ANN202
    rows = {r.name: r for r in check_model(model, gpu, PreflightOptions(tp=tp))}
    return rows.get("model: MoE tiles")


@pytest.mark.parametrize("arch", ["Qwen3MoeForCausalLM", "MixtralForCausalLM"])
def test_moe_weights_held_and_read_per_token(arch: str, tiny_model_dir) -> None:  # noqa: ANN001
    path = Path(tiny_model_dir(arch, **MOE_TINY[arch]))
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        sizes = {k: f.get_slice(k).get_shape() for k in f.keys()}  # noqa: SIM118
    expert = sum(4 * s[0] * s[1] for k, s in sizes.items() if ".experts." in k)  # fp32
    model = probe_model(path)
    assert model.problems == []
    facts = (model.num_experts, model.experts_per_token, model.expert_intermediate_size)
    assert facts == (8, 2, 32)
    assert model.expert_bytes == expert > 0
    assert model.active_weight_bytes == model.weight_bytes - expert * 6 // 8
    rows = {r.name: r for r in check_model(model, _gpu(), PreflightOptions())}
    assert "mixture of 8 experts, 2 per token" in rows["model: memory fit"].observed


@pytest.fixture
def tile_tables(moe_table_dir: Path):  # noqa: ANN201
    """Writes ``{device name: shapes}`` as that GPU's tile table, in a directory of the test's
    own."""

    def write(tables: dict[str, dict]) -> None:
        for name, shapes in tables.items():
            moe_tiles.table_path(name).write_text(json.dumps({"device": name, "shapes": shapes}))
        moe_tiles.reload_tables()

    return write


def test_moe_tiles_named_for_each_rank_shape_or_the_tuner_command(
    tiny_model_dir,
    tile_tables,  # noqa: ANN001
) -> None:
    """The experts' shape a rank runs (gate/up N = 2 x intermediate / tp) is looked up in the
    GPU's table: tuned formats named, else a warning with the tuner's command for this model."""
    arch = "Qwen3MoeForCausalLM"
    path = Path(tiny_model_dir(arch, **MOE_TINY[arch]))
    model = probe_model(path)
    assert model.expert_intermediate_size == 32
    tile_tables({"NVIDIA H200": {
        "nvfp4_gemv E=8 N=64 K=64 top_k=2": {"1": {"gate_up": {}, "down": {}}},
        "bfloat16 E=8 N=64 K=64 top_k=2": {"1": {"gate_up": TILE, "down": TILE}},
    }})  # fmt: skip
    row = _tiles_row(model, _gpu())
    assert row.status == Status.PASS
    assert row.observed == "NVIDIA H200: bfloat16, nvfp4_gemv at E=8 N=64 K=64 top_k=2"
    row = _tiles_row(model, _gpu(), tp=2)
    assert row.status == Status.WARN and "no entry for E=8 N=32 K=64 top_k=2" in row.observed
    assert f"benchmarks.moe_tune --models {path} " in row.fix and "--tp 2" in row.fix
    assert "KVSERVE_MOE_CONFIG_DIR=DIR" in row.fix
    assert _tiles_row(model, _gpu("NVIDIA H100 80GB HBM3")).status == Status.WARN


def test_moe_tiles_malformed_table_fails_and_dense_models_have_no_row(
    tiny_model_dir,
    tile_tables,  # noqa: ANN001
) -> None:
    arch = "Qwen3MoeForCausalLM"
    model = probe_model(Path(tiny_model_dir(arch, **MOE_TINY[arch])))
    tile_tables({"NVIDIA H200": {"bfloat16 E=8 N=64 K=64 top_k=2": {"1": {"gate_up": {}}}}})
    row = _tiles_row(model, _gpu())
    assert row.status == Status.FAIL and "NVIDIA_H200.json" in row.observed
    dense = probe_model(Path(tiny_model_dir("Qwen3ForCausalLM")))
    assert _tiles_row(dense, _gpu()) is None


def test_preflight_model_checks_import_no_torch() -> None:
    """``kvserve preflight`` answers on nodes where torch is broken: reading tile tables must
    not import it."""
    code = ("import sys, kvserve.preflight.checks.model, kvserve.preflight.probes.model_files; "
            "assert 'torch' not in sys.modules, 'torch imported'")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True)


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
    assert model.expert_intermediate_size == 32
    stacked = [t for t in gguf.GGUFReader(path).tensors if "_exps." in t.name]
    decoder = [t for t in stacked if not t.name.startswith("blk.2.")]
    assert (len(stacked), len(decoder)) == (5, 3)  # layer 1's three, the MTP block's two
    assert model.expert_bytes == sum(int(t.n_bytes) for t in decoder) > 0


def test_preflight_names_every_gguf_architecture_the_loader_reads() -> None:
    """Preflight and the loader read one table, in a module that imports no torch (preflight
    must not), so the probe cannot fall behind the loader."""
    from kvserve import gguf_architectures
    from kvserve.loader.architectures import GGUF_ARCHITECTURES as LOADED
    from kvserve.preflight.probes import model_files

    assert gguf_architectures.GGUF_ARCHITECTURES is LOADED
    assert model_files.hf_architecture is gguf_architectures.hf_architecture
    imports = [line for line in Path(gguf_architectures.__file__).read_text().splitlines()
               if line.startswith(("import ", "from "))]  # fmt: skip
    assert imports == ["from __future__ import annotations"]
