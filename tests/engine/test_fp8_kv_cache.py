"""``kv_cache_dtype="fp8_e4m3"`` (alias ``fp8``) end to end on CPU: the pool holds one byte per
value, per-layer k/v scales come from the checkpoint (1.0 when it has none), and greedy output
stays close to the unquantized cache's."""

from __future__ import annotations

import pytest
import torch
from engine_checks import assert_engine_clean
from safetensors.torch import load_file, save_file

from kvserve import LLM, SamplingParams
from kvserve.errors import ModelLoadError

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Photosynthesis converts sunlight into",
    "List three prime numbers:",
]
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


def test_bundled_model_with_fp8_kv_agrees_with_the_unquantized_cache(bundled_llm) -> None:
    llm = LLM(device="cpu", kv_cache_dtype="fp8")
    pool = llm.engine.runner.kv
    assert pool.dtype == torch.float8_e4m3fn and pool.is_fp8
    assert pool.bytes_per_token * 4 == bundled_llm.engine.runner.kv.bytes_per_token  # vs fp32
    got = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    want = [o.token_ids for o in bundled_llm.generate(PROMPTS, GREEDY)]
    # Same tokens until the first divergence; FP8 KV (3 mantissa bits, scale 1.0) may flip a
    # near-tie, after which the continuations differ legitimately.
    agree = [next((i for i, (a, b) in enumerate(zip(g, w)) if a != b), len(g)) for g, w in
             zip(got, want, strict=True)]  # fmt: skip
    assert sum(agree) >= 0.75 * sum(len(w) for w in want), (agree, got, want)
    assert_engine_clean(llm.engine)


def _with_kv_scales(src, model_dir, scales: dict[str, torch.Tensor]):  # noqa: ANN001, ANN202
    """A copy of the tiny model ``src`` in ``model_dir`` whose checkpoint also holds
    ``scales``."""
    model_dir.mkdir()
    for f in src.iterdir():
        (model_dir / f.name).write_bytes(f.read_bytes())
    path = model_dir / "model.safetensors"
    tensors = load_file(path)
    tensors.update(scales)
    save_file(tensors, path, metadata={"format": "pt"})
    return model_dir


def test_kv_scales_load_from_the_checkpoint(tiny_model_dir, tmp_path) -> None:
    model_dir = _with_kv_scales(
        tiny_model_dir("LlamaForCausalLM"),
        tmp_path / "llama-kv-scales",
        {
            "model.layers.0.self_attn.k_scale": torch.tensor(0.5),  # compressed-tensors names
            "model.layers.0.self_attn.v_scale": torch.tensor(0.25),
            "model.layers.1.self_attn.k_proj.k_scale": torch.tensor([0.125]),  # ModelOpt names
            "model.layers.1.self_attn.v_proj.v_scale": torch.tensor([2.0]),
        },
    )
    llm = LLM(model=str(model_dir), device="cpu", kv_cache_dtype="fp8_e4m3")
    pool = llm.engine.runner.kv
    assert pool.k_scales.tolist() == [0.5, 0.125] and pool.v_scales.tolist() == [0.25, 2.0]
    fp8 = llm.generate([[5, 6, 7, 8, 9]], GREEDY)[0].token_ids
    plain = LLM(model=str(model_dir), device="cpu").generate([[5, 6, 7, 8, 9]], GREEDY)[0]
    assert plain.token_ids[:4] == fp8[:4]
    assert_engine_clean(llm.engine)


def test_a_per_head_kv_scale_is_refused_with_its_name(tiny_model_dir, tmp_path) -> None:
    model_dir = _with_kv_scales(
        tiny_model_dir("LlamaForCausalLM"),
        tmp_path / "llama-bad-scale",
        {"model.layers.0.self_attn.k_scale": torch.ones(2)},
    )
    with pytest.raises(ModelLoadError, match=r"self_attn\.k_scale.*per-head"):
        LLM(model=str(model_dir), device="cpu", kv_cache_dtype="fp8")
