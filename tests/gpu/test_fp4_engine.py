"""FP4 weights (NVFP4, MXFP4) in the engine on a GPU: online quantization gives the CPU
reference's greedy tokens through the Triton FP4 GEMM, and CUDA graphs give eager's tokens
(the field reports graph capture crashing with FP4 kernels).

Tiny random checkpoints saved on the spot, weights drawn wide (initializer_range 0.5) so that
greedy choices do not hinge on rounding.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvserve.engine.config_builder import build_engine_config
from kvserve.engine.engine_core import EngineCore

pytestmark = pytest.mark.gpu
pytest.importorskip("triton")

from test_engine_gpu import _greedy  # noqa: E402

FORMATS = ["nvfp4", "mxfp4"]


def _tiny_checkpoint(path) -> str:  # noqa: ANN001
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=3,
        num_attention_heads=8, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=2048, initializer_range=0.5, eos_token_id=0,
    )  # fmt: skip
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(path, safe_serialization=True)
    return str(path)


@pytest.mark.parametrize("fmt", FORMATS)
def test_online_fp4_on_gpu_matches_cpu(fmt: str, tmp_path) -> None:
    path = _tiny_checkpoint(tmp_path)
    settings = {"dtype": "float32", "quantization": fmt}
    cpu = _greedy(EngineCore(build_engine_config(path, device="cpu", **settings)))
    gpu_core = EngineCore(build_engine_config(path, device="cuda", **settings))
    assert gpu_core.runner.graphs is not None
    assert _greedy(gpu_core) == cpu


@pytest.mark.parametrize("fmt", FORMATS)
def test_dummy_fp4_cuda_graphs_match_eager(fmt: str, tmp_path) -> None:
    path = _tiny_checkpoint(tmp_path)
    settings = {
        "device": "cuda", "dtype": "bfloat16", "load_format": "dummy", "quantization": fmt,
        "max_total_tokens": 8192,
    }  # fmt: skip
    graphs = EngineCore(build_engine_config(path, **settings))
    assert graphs.runner.graphs is not None
    eager = EngineCore(build_engine_config(path, enforce_eager=True, **settings))
    assert _greedy(graphs) == _greedy(eager)


@pytest.mark.parametrize("fmt", FORMATS)
def test_steps_past_128_rows_dequantize_and_match_cpu(fmt: str, tmp_path) -> None:
    """Prefill chunks and decode batches of more than 128 rows dequantize W and run cuBLAS
    (``fp4_gemm.DEQUANT_GEMM_MIN_ROWS``), decode batches inside the CUDA graphs: greedy tokens
    as the CPU reference's, and as eager's."""
    path = _tiny_checkpoint(tmp_path)
    prompts = [[(37 * i + 11 * j) % 1000 + 1 for j in range(20 + i % 50)] for i in range(160)]
    # a token budget, so that the second GPU engine finds memory for its pool
    settings = {"dtype": "float32", "quantization": fmt, "max_total_tokens": 16384}
    wide = {"n_tokens": 4, "prompts": prompts, "min_width": 129}  # past one x tile of the MMA
    cpu = _greedy(EngineCore(build_engine_config(path, device="cpu", **settings)), **wide)
    graphs = EngineCore(build_engine_config(path, device="cuda", **settings))
    assert graphs.runner.graphs is not None and graphs.runner.graphs.max_bs >= 160
    assert _greedy(graphs, **wide) == cpu
    eager = EngineCore(build_engine_config(path, device="cuda", enforce_eager=True, **settings))
    assert _greedy(eager, **wide) == cpu


@pytest.mark.parametrize("fmt", FORMATS)
def test_async_gemm_in_the_engine_gives_the_triton_kernels_tokens(
    fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bf16 decode batches of 17-128 rows on the asynchronous-MMA FP4 GEMM (Hopper,
    ``KVSERVE_FP4_ASYNC=1``: every such step, inside the CUDA graphs) give the greedy tokens of
    the Triton kernel (``KVSERVE_FP4_ASYNC=0``): every prompt's first tokens, and all eight of
    nearly every prompt. Not all: bf16 sums in another order flip a near tie now and then (s75,
    H100: MXFP4's 8th token of 1 prompt in 40), where a wrong scale, layout or permutation of
    x would change most tokens from the first."""
    from kvserve.kernels import fp4_async_choice

    tokens = {}
    for mode in ("0", "1"):
        tokens[mode], calls = _async_run(
            fmt, tmp_path, monkeypatch, {fp4_async_choice.ASYNC_ENV: mode}
        )
        assert bool(calls) is (mode == "1")
    assert [t[:4] for t in tokens["1"]] == [t[:4] for t in tokens["0"]]
    assert sum(a == b for a, b in zip(tokens["1"], tokens["0"], strict=True)) >= 0.9 * len(_PROMPTS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_x_permuted_by_its_producer_gives_the_same_tokens(
    fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The RMSNorm before q/k/v and gate/up and the SiLU-mul before down write x in the async
    GEMM's step order (``KVSERVE_FP4_PERMUTE_IN_PRODUCER=1``, the default) where that GEMM
    takes the step: the same values reach the same kernel as when it permutes x itself, so the
    tokens are identical; and three of a layer's four GEMMs take x so permuted (o's x comes
    from attention)."""
    from kvserve.kernels import fp4_async_choice

    env = {fp4_async_choice.ASYNC_ENV: "1", fp4_async_choice.PERMUTE_IN_PRODUCER_ENV: "0"}
    apart, calls = _async_run(fmt, tmp_path, monkeypatch, env)
    assert calls and not any(permuted for _, permuted in calls)
    env[fp4_async_choice.PERMUTE_IN_PRODUCER_ENV] = "1"
    folded, calls = _async_run(fmt, tmp_path, monkeypatch, env)
    assert calls and 3 * len(calls) == 4 * sum(permuted for _, permuted in calls)
    assert folded == apart


_PROMPTS = [[(29 * i + 7 * j) % 1000 + 1 for j in range(8 + i % 13)] for i in range(40)]


def _async_run(
    fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> tuple[list[list[int]], list[tuple[int, bool]]]:
    """Greedy tokens of 40 prompts, decode batches of 17-40 rows in CUDA graphs, under the
    settings ``env``; and each call of the async GEMM while the engine ran, as (rows, whether
    x came permuted)."""
    from kvserve.kernels import fp4_async_choice, fp4_gemm
    from kvserve.kernels.fp4_async_gemm import HAS_GLUON

    if not (HAS_GLUON and torch.cuda.get_device_capability()[0] == 9):
        pytest.skip("the asynchronous-MMA FP4 GEMM needs Gluon and a Hopper GPU")
    calls = []

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append((args[0].shape[0], kwargs.get("x_permuted", False)))
        return original(*args, **kwargs)

    original = fp4_gemm.fp4_async_linear
    monkeypatch.setattr(fp4_gemm, "fp4_async_linear", counted)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    readers = (fp4_async_choice.async_gemm_mode, fp4_async_choice.permute_in_producer)
    for reader in readers:
        reader.cache_clear()
    try:
        settings = {"device": "cuda", "dtype": "bfloat16", "quantization": fmt,
                    "max_total_tokens": 8192}  # fmt: skip
        core = EngineCore(build_engine_config(str(_tiny_checkpoint(tmp_path)), **settings))
        tokens = _greedy(core, n_tokens=8, prompts=_PROMPTS, min_width=17)
        del core
    finally:
        for reader in readers:
            reader.cache_clear()
    return tokens, calls
