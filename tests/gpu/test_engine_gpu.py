"""The engine on a GPU: greedy tokens through the Triton backend, fused kernels and CUDA graphs
against the CPU torch path and against eager GPU runs.

Models are tiny random checkpoints saved by transformers on the spot (the bundled GGUF is too
large to travel to the GPU machine). Their weights are drawn wide (initializer_range 0.5) so
logits are peaked and greedy choices do not hinge on rounding.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kvserve.engine.config_builder import build_engine_config
from kvserve.engine.core.sampling_params import SamplingParams
from kvserve.engine.engine_core import EngineCore
from kvserve.errors import ConfigError
from kvserve.layers import moe_router
from kvserve.models.decoder import Attention

pytestmark = pytest.mark.gpu
pytest.importorskip("triton")

sys.path.insert(0, str(Path(__file__).parents[1] / "quant"))
from fp8_helpers import step_logits  # noqa: E402

PROMPTS = [list(range(3, 40)), [7] * 5, list(range(500, 800, 3)), [11, 12] * 40]


# Mixture-of-experts fields: GLM with q/k norm and half rotary, so that both features of the
# fused rotary + KV-store kernel, the router-logits kernel and grouped routing run on the GPU.
MOE_FIELDS = {
    "Qwen3MoeForCausalLM": {
        "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
        "norm_topk_prob": True, "decoder_sparse_step": 1,
    },
    "Glm4MoeForCausalLM": {
        "n_routed_experts": 8, "num_experts_per_tok": 3, "moe_intermediate_size": 64,
        "n_group": 4, "topk_group": 2, "n_shared_experts": 1, "first_k_dense_replace": 1,
        "routed_scaling_factor": 2.5, "partial_rotary_factor": 0.5, "use_qk_norm": True,
    },
    # every layer sparse, experts intermediate_size (256) wide, no q/k norm
    "MixtralForCausalLM": {
        "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": None,
    },
}  # fmt: skip


def _tiny_checkpoint(arch: str, path, initializer_range: float = 0.5) -> str:  # noqa: ANN001
    import transformers

    config_cls = arch.replace("ForCausalLM", "Config")
    config = getattr(transformers, config_cls)(
        vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
        num_attention_heads=8, num_key_value_heads=2, head_dim=64,
        max_position_embeddings=2048, initializer_range=initializer_range, eos_token_id=0,
        **MOE_FIELDS.get(arch, {}),
    )  # fmt: skip
    config.architectures = [arch]
    torch.manual_seed(0)
    getattr(transformers, arch)(config).save_pretrained(path, safe_serialization=True)
    return str(path)


def _greedy(
    core: EngineCore, n_tokens: int = 24, prompts: list[list[int]] = PROMPTS, min_width: int = 0
) -> list[list[int]]:
    """Greedy tokens of each prompt; ``min_width``: some step must output that many rows."""
    params = SamplingParams(temperature=0, max_tokens=n_tokens, ignore_eos=True)
    for i, p in enumerate(prompts):
        core.add_request(str(i), p, params)
    out: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    widest = 0
    while core.has_unfinished():
        step = core.step()
        widest = max(widest, len(step))
        for o in step:
            out[o.request_id] += o.new_token_ids
    core.check_integrity()
    assert widest >= min_width
    return [out[str(i)] for i in range(len(prompts))]


def test_no_memory_for_kv_pages_is_refused_before_the_warm_up(tmp_path) -> None:
    """Too small a --mem-fraction-static (or another engine holding the GPU) leaves no KV pages;
    the warm-up and graph capture read page 0, so the engine must refuse before them (it
    crashed with an illegal memory access, which poisons the process's CUDA context)."""
    path = _tiny_checkpoint("LlamaForCausalLM", tmp_path)
    with pytest.raises(ConfigError, match="no GPU memory is left for the KV cache"):
        EngineCore(build_engine_config(path, device="cuda", mem_fraction_static=0.0001))
    assert torch.zeros(1, device="cuda").item() == 0  # the context is still usable


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Qwen3ForCausalLM", "MixtralForCausalLM"])
def test_gpu_triton_float32_matches_cpu(arch, tmp_path) -> None:
    path = _tiny_checkpoint(arch, tmp_path)
    cpu = _greedy(EngineCore(build_engine_config(path, device="cpu", dtype="float32")))
    gpu_core = EngineCore(build_engine_config(path, device="cuda", dtype="float32"))
    assert gpu_core.runner.backend.name == "triton"
    assert gpu_core.runner.graphs is not None
    assert _greedy(gpu_core) == cpu


@pytest.mark.parametrize("arch", sorted(MOE_FIELDS))
def test_moe_fused_kernels_give_the_unfused_paths_tokens(arch, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """The q/k norm + (partial) rotary + KV store kernel and the router kernels (logits, and
    the post-attention norm + logits + top-k in one launch at decode) against the path they
    replaced (norm, rotary and store kernels; the norm, then the router through cuBLAS, then
    the top-k): the same greedy tokens on the GPU. Against the CPU's, these float32 MoE models
    parted after 6 (Qwen3) and 12 (GLM) tokens on both paths alike at c2e3a32, when the grouped
    GEMM still rounded its inputs to TF32."""
    path = _tiny_checkpoint(arch, tmp_path)
    settings = {"device": "cuda", "dtype": "float32", "max_total_tokens": 8192}  # two engines
    fused = _greedy(EngineCore(build_engine_config(path, **settings)))
    monkeypatch.setattr(Attention, "_fuses_rotary_store", lambda self, ctx: False)
    monkeypatch.setattr(moe_router, "router_logits", lambda x, w, pdl: F.linear(x.float(), w))
    monkeypatch.setattr(moe_router, "FUSED_TOPK_MAX_TOKENS", 0)
    assert _greedy(EngineCore(build_engine_config(path, **settings))) == fused


def test_cuda_graphs_and_eager_give_the_same_tokens(tmp_path) -> None:
    path = _tiny_checkpoint("LlamaForCausalLM", tmp_path)
    # Both engines share one GPU here: give each an explicit KV budget. float32, because the
    # graph's page-table width (the context) sets a different split count in the decode kernel
    # than eager's (the batch's longest sequence): bf16 sums in another order flip near-ties.
    graphs_cfg = build_engine_config(path, device="cuda", dtype="float32", max_total_tokens=8192)
    eager_cfg = build_engine_config(
        path, device="cuda", dtype="float32", max_total_tokens=8192, enforce_eager=True
    )
    graphs, eager = EngineCore(graphs_cfg), EngineCore(eager_cfg)
    assert graphs.runner.graphs is not None and eager.runner.graphs is None
    assert _greedy(graphs) == _greedy(eager)


def test_graphs_cover_every_decode_batch_the_scheduler_can_form(tmp_path) -> None:
    path = _tiny_checkpoint("LlamaForCausalLM", tmp_path)
    settings = {"device": "cuda", "max_total_tokens": 8192}
    wide = EngineCore(build_engine_config(path, max_running_requests=300, **settings))
    assert wide.runner.graphs is not None and wide.runner.graphs.max_bs == 300
    del wide
    capped = build_engine_config(path, max_running_requests=300, cuda_graph_max_bs=64, **settings)
    assert EngineCore(capped).runner.graphs.max_bs == 64


def test_programmatic_launch_reaches_every_kernel_and_keeps_the_tokens(tmp_path) -> None:
    """On by default on sm_90+ (backend and every kernel layer), off with ``disable_pdl``; the
    graphs replay the same tokens either way."""
    path = _tiny_checkpoint("LlamaForCausalLM", tmp_path)
    settings = dict(device="cuda", dtype="float32", max_total_tokens=8192)
    on = EngineCore(build_engine_config(path, **settings))
    off = EngineCore(build_engine_config(path, disable_pdl=True, **settings))
    sm90 = torch.cuda.get_device_capability() >= (9, 0)
    for core, expected in ((on, sm90), (off, False)):
        layers = [m for m in core.runner.model.modules() if hasattr(m, "kernels")]
        assert layers and all(m.kernels == core.runner.kernels for m in layers)
        assert core.runner.kernels.triton and core.runner.kernels.pdl is expected
        assert core.runner.backend.pdl is expected
    assert _greedy(on) == _greedy(off)


def test_gpu_bfloat16_follows_transformers_up_to_near_ties(tmp_path) -> None:
    """In bf16 two correct implementations round differently, so greedy paths may part where
    the reference's top two logits are nearly tied; before that they must agree exactly."""
    import transformers

    path = _tiny_checkpoint("Qwen3ForCausalLM", tmp_path)
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda()
    ours = _greedy(EngineCore(build_engine_config(path, device="cuda", dtype="bfloat16")), 16)
    exact = 0
    for prompt, tokens in zip(PROMPTS, ours):
        with torch.no_grad():
            out = ref.generate(
                torch.tensor([prompt], device="cuda"), max_new_tokens=16, min_new_tokens=16,
                do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True,
            )  # fmt: skip
        expected = out.sequences[0, len(prompt) :].tolist()
        if expected == tokens:
            exact += 1
            continue
        first = next(i for i, (a, b) in enumerate(zip(expected, tokens)) if a != b)
        top2 = out.logits[first][0].float().topk(2).values
        assert (top2[0] - top2[1]).item() < 0.05 * top2[0].abs().item() + 0.25, first
    assert exact >= len(PROMPTS) // 2


def test_kv_cache_sized_from_memory_fraction(tmp_path) -> None:
    path = _tiny_checkpoint("LlamaForCausalLM", tmp_path)
    import gc

    pages = []
    for fraction in (0.2, 0.4):
        core = EngineCore(build_engine_config(path, device="cuda", mem_fraction_static=fraction))
        pages.append(core.kv.num_pages)
        del core
        gc.collect()
        torch.cuda.empty_cache()
    assert pages[1] > pages[0] > 0


def _forced_logits(core: EngineCore, prompt: list[int], forced: list[int]) -> torch.Tensor:
    """float32 logits of the prompt's last position, then of one decode step per token of
    ``forced`` fed in turn (``fp8_helpers.step_logits``: eager)."""
    params = SamplingParams(temperature=0, max_tokens=len(forced) + 1, ignore_eos=True)
    core.add_request("r", prompt, params)
    rows = []
    for token in [*forced, None]:
        plan, logits = step_logits(core)
        rows.append(logits[-1].float().cpu())
        if token is not None:
            core.scheduler.update(plan, {"r": token})
    return torch.stack(rows)


def test_fp8_kv_cache_on_the_gpu_follows_the_cpu(tmp_path) -> None:
    """The triton backend over an FP8 cache (pages stored heads-major; prefill, then decode, on
    FP8 tensor cores with q and p in e4m3) against the CPU torch backend over its own
    FP8 cache, token by token on the same forced continuation. Logits, not greedy tokens, of a
    model drawn as real ones are (initializer_range 0.02): the wide draws of the other tests
    push keys and values past e4m3's range at scale 1, where the FP8 cache alone moves 60% of
    the CPU's argmaxes."""
    path = _tiny_checkpoint("LlamaForCausalLM", tmp_path, initializer_range=0.02)
    prompt, forced = list(range(3, 90)), [int(t) for t in torch.randint(1, 1000, (24,))]
    cpu = EngineCore(build_engine_config(path, device="cpu", kv_cache_dtype="fp8"))
    gpu = EngineCore(
        build_engine_config(
            path, device="cuda", dtype="float32", kv_cache_dtype="fp8", max_total_tokens=8192
        )  # fmt: skip
    )
    assert gpu.runner.kv.is_fp8 and gpu.runner.backend.name == "triton"
    exact = EngineCore(build_engine_config(path, device="cpu"))  # float32 cache
    want, got = _forced_logits(cpu, prompt, forced), _forced_logits(gpu, prompt, forced)
    unquantized = _forced_logits(exact, prompt, forced)

    def error(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # a step's worst logit, relative
        return (a - b).abs().amax(-1) / b.abs().amax(-1)

    # The GPU's kernels depart from the CPU's FP8 path by less than the FP8 cache itself costs
    # (2.2% on the CPU for this model)
    gpu_error, cache_error = error(got, want), error(want, unquantized)
    assert gpu_error.max() < 0.05 and gpu_error.max() < cache_error.max(), (gpu_error, cache_error)


_COLD_START = """
import json, sys
sys.path.insert(0, sys.argv[2])
from test_engine_gpu import _greedy
from kvserve.engine.config_builder import build_engine_config
from kvserve.engine.engine_core import EngineCore
core = EngineCore(build_engine_config(sys.argv[1], device="cuda", max_total_tokens=8192))
report = core.runner.start_report
print(json.dumps({"tokens": _greedy(core), "late": report.late_compiles, "cached": report.cached,
                  "kernels": report.ahead.kernels, "failed": report.ahead.failed,
                  "ahead_cached": report.ahead.cached, "recorded": report.recorded}))
"""


def test_a_cold_start_compiles_its_kernels_ahead_and_none_at_their_launch(tmp_path) -> None:
    """An empty Triton cache in a new process: the start records the kernels its passes launch,
    worker processes compile them, and the passes then load each from the disk cache, compiling
    none. The tokens are those of an engine whose kernels compiled at their launch. A second
    start of the same engine reads the kernel list its start manifest kept, records nothing,
    and finds every kernel cached."""
    import json
    import os
    import subprocess

    path = _tiny_checkpoint("LlamaForCausalLM", tmp_path)
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "triton"),
           "KVSERVE_COMPILE_WORKERS": "4"}  # fmt: skip

    def start() -> dict:
        run = subprocess.run(
            [sys.executable, "-c", _COLD_START, path, str(Path(__file__).parent)],
            env=env, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]
        return json.loads(run.stdout.strip().splitlines()[-1])

    cold = start()
    assert cold["failed"] == [] and cold["late"] == [] and cold["recorded"]
    assert cold["kernels"] >= 10 and cold["cached"] == cold["kernels"]
    assert cold["ahead_cached"] == 0
    warm = start()
    assert not warm["recorded"] and warm["late"] == [] and warm["failed"] == []
    assert warm["kernels"] == warm["ahead_cached"] == cold["kernels"]
    assert warm["tokens"] == cold["tokens"]
    here = EngineCore(build_engine_config(path, device="cuda", max_total_tokens=8192))
    assert _greedy(here) == cold["tokens"]
