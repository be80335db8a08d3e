"""Quantized mixture-of-experts checkpoints written by llmcompressor (tiny Qwen3-MoE, per-expert
compressed-tensors tensors; tests/fixtures/quant/make_moe_fixtures.py): kvserve's stacked
experts dequantize to what compressed-tensors dequantizes, and the engine's logits and greedy
tokens match transformers running the checkpoint dequantized by compressed-tensors (an fp32
model with the same weights)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fp8_helpers import FIXTURES, cpu_engine, fixture_config, prefill_logits

from kvserve import LLM, SamplingParams
from kvserve.kernels.fused_moe_fp4 import dequantize_fp4_experts
from kvserve.kernels.fused_moe_fp8 import dequantize_fp8_experts
from kvserve.layers.moe import SparseMoE
from kvserve.quant.moe_method import EXPERT_SHARDS

ct = pytest.importorskip("compressed_tensors")
from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8  # noqa: E402
from compressed_tensors.quantization import QuantizationArgs  # noqa: E402
from compressed_tensors.quantization.lifecycle.forward import dequantize  # noqa: E402

LAYOUTS = ["moe_fp8_block", "moe_fp8_dynamic", "moe_nvfp4"]
PROMPT = list(range(3, 60)) + [200, 17, 17, 90]
# Largest logit difference as a share of the largest reference logit. NVFP4 is weight-only:
# both sides multiply the same weights. The FP8 layouts also quantize every linear's and
# expert's input to FP8 per token (group), as the checkpoint prescribes and the dequantized
# reference does not: that alone moves this random model's logits by 8.0% (block) and 7.3%
# (per-channel) of the largest (with it turned off, 8.5e-7); top-1 agreement 90% / 93%.
# NVFP4 measured: 7.3e-7.
LOGITS_TOLERANCE = {"moe_fp8_block": 0.12, "moe_fp8_dynamic": 0.12, "moe_nvfp4": 1e-4}


def _dequantize(tensors: dict[str, torch.Tensor], name: str, args: QuantizationArgs) -> dict:
    """One quantized linear of the checkpoint, dequantized by compressed-tensors."""
    if name + ".weight_packed" in tensors:
        packed = tensors[name + ".weight_packed"]
        rows, half = packed.shape
        codes = unpack_fp4_from_uint8(packed, rows, 2 * half, dtype=torch.float32)
        scale = tensors[name + ".weight_scale"].float() / tensors[name + ".weight_global_scale"]
        return codes * scale.repeat_interleave(16, dim=1)
    scale = tensors[name + ".weight_scale"].float()
    return dequantize(tensors[name + ".weight"], scale, args=args, dtype=torch.float32)


def _quantized_linears(tensors: dict[str, torch.Tensor]) -> list[str]:
    return sorted({n.rpartition(".")[0] for n in tensors if n.endswith(".weight_scale")})


@pytest.fixture(scope="module")
def dequantized_dirs(tmp_path_factory) -> dict[str, Path]:  # noqa: ANN001
    """Each fixture as an unquantized fp32 HF checkpoint."""
    from safetensors.torch import load_file, save_file

    out = {}
    for layout in LAYOUTS:
        args = QuantizationArgs(**fixture_config(layout)["config_groups"]["group_0"]["weights"])
        tensors = load_file(str(FIXTURES / layout / "model.safetensors"))
        linears = _quantized_linears(tensors)
        dense = {f"{n}.weight": _dequantize(tensors, n, args) for n in linears}
        dense |= {n: t.float() for n, t in tensors.items() if n.rpartition(".")[0] not in linears}
        path = tmp_path_factory.mktemp(layout)
        save_file(dense, str(path / "model.safetensors"))
        config = json.loads((FIXTURES / layout / "config.json").read_text())
        config.pop("quantization_config")
        config["dtype"] = "float32"
        (path / "config.json").write_text(json.dumps(config))
        out[layout] = path
    return out


@pytest.fixture(scope="module")
def engines() -> dict:
    return {layout: cpu_engine(FIXTURES / layout) for layout in LAYOUTS}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_experts_dequantize_as_compressed_tensors_does(
    layout: str, engines, dequantized_dirs
) -> None:  # noqa: ANN001, E501
    from safetensors.torch import load_file

    reference = load_file(str(dequantized_dirs[layout] / "model.safetensors"))
    moe = next(m for m in engines[layout].runner.model.modules() if isinstance(m, SparseMoE))
    stacks = {}
    for s in ("w13", "w2"):
        w, scale = getattr(moe, s), getattr(moe, f"{s}_scale")
        if layout == "moe_nvfp4":
            stacks[s] = dequantize_fp4_experts((w, scale, getattr(moe, f"{s}_row_scale")))
        else:
            stacks[s] = dequantize_fp8_experts(w, scale, moe.method.block)
    inter = moe.cfg.expert_intermediate_size
    # NVFP4: e4m3 scale / global scale here, e4m3 scale * (1 / global) there: fp32 rounding
    rtol = 1e-6 if layout == "moe_nvfp4" else 0.0
    for expert in range(moe.cfg.num_experts):
        for proj, (stack, shard) in EXPERT_SHARDS.items():
            ref = reference[f"model.layers.1.mlp.experts.{expert}.{proj}.weight"]
            rows = slice(shard * inter, (shard + 1) * inter) if stack == "w13" else slice(None)
            torch.testing.assert_close(stacks[stack][expert][rows], ref, rtol=rtol, atol=0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_logits_match_the_dequantized_model(layout: str, engines, dequantized_dirs) -> None:  # noqa: ANN001
    import transformers

    ref_model = transformers.AutoModelForCausalLM.from_pretrained(
        str(dequantized_dirs[layout]), dtype=torch.float32
    ).eval()
    with torch.no_grad():
        want = ref_model(torch.tensor([PROMPT])).logits[0]
    got = prefill_logits(engines[layout], PROMPT)
    err = (got - want).abs().max().item() / want.abs().max().item()
    assert err <= LOGITS_TOLERANCE[layout], err
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.85


@pytest.mark.parametrize("layout", LAYOUTS)
def test_greedy_tokens_match_the_dequantized_model(layout: str, dequantized_dirs) -> None:  # noqa: ANN001
    """The engine on the quantized files (chunked prefill, two requests batched) against the
    engine on the dequantized files (itself checked against transformers in tests/engine).
    NVFP4: the same tokens. FP8 quantizes activations too, so a near tie can go the other
    way and the two continuations part: on the first prompt the first 8 tokens must agree
    (measured: 10 of 12 block, 12 of 12 per-channel); the second prompt starts on a near tie
    in this random model (its first token already differs in both FP8 layouts). The FP8
    engine must give its own tokens again one request at a time without chunking."""
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompts = [PROMPT, [5, 9, 200, 31] * 5]
    settings = {"device": "cpu", "max_total_tokens": 1024}
    llm = LLM(model=str(FIXTURES / layout), chunked_prefill_size=16, **settings)
    quantized = [o.token_ids for o in llm.generate(prompts, params)]
    dense_llm = LLM(model=str(dequantized_dirs[layout]), **settings)
    dense = [o.token_ids for o in dense_llm.generate(prompts, params)]
    if layout == "moe_nvfp4":
        assert quantized == dense
        return
    assert quantized[0][:8] == dense[0][:8]
    alone = [LLM(model=str(FIXTURES / layout), **settings).generate([p], params)[0].token_ids
             for p in prompts]  # fmt: skip
    assert alone == quantized


def test_qwen_fp8_layout_reads_the_same_experts(tmp_path) -> None:  # noqa: ANN001
    """The block fixture rewritten as Qwen3-30B-A3B-FP8 ships it (``quant_method: fp8``,
    ``weight_block_size``, ``weight_scale_inv`` per expert projection) gives the same logits."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(FIXTURES / "moe_fp8_block" / "model.safetensors"))
    renamed = {n.replace(".weight_scale", ".weight_scale_inv"): t.float() if "scale" in n else t
               for n, t in tensors.items()}  # fmt: skip
    save_file(renamed, str(tmp_path / "model.safetensors"))
    config = json.loads((FIXTURES / "moe_fp8_block" / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    got = prefill_logits(cpu_engine(tmp_path), PROMPT)
    want = prefill_logits(cpu_engine(FIXTURES / "moe_fp8_block"), PROMPT)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
