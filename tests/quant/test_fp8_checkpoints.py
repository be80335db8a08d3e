"""FP8 checkpoints written by llmcompressor (tests/fixtures/quant, made by make_fp8_fixtures.py)
and a ModelOpt-layout one, read by kvserve and checked against compressed-tensors, an
independent implementation of the same formats: the weights kvserve dequantizes, the scales it
computes for activations, and the logits against transformers running the same checkpoint
through compressed-tensors (its fake-quantized forward)."""

from __future__ import annotations

import json

import pytest
import torch
from fp8_helpers import FIXTURES, cpu_engine, fixture_config, prefill_logits

from kvserve.kernels.fp8_gemm import dequantize_fp8_weight
from kvserve.kernels.fp8_quant import quantize_fp8_reference
from kvserve.layers.linear import Linear
from kvserve.models.decoder import STACKED_PARAMS
from kvserve.quant.method import shard_rows

ct = pytest.importorskip("compressed_tensors")
from compressed_tensors.quantization import QuantizationArgs  # noqa: E402
from compressed_tensors.quantization.lifecycle.forward import (  # noqa: E402
    dequantize,
    fake_quantize,
    quantize,
)
from compressed_tensors.quantization.utils import calculate_qparams  # noqa: E402

LAYOUTS = ["fp8_dynamic", "fp8_block", "fp8_static"]
PROMPT = list(range(3, 60)) + [200, 17, 17, 90]
# Logits of kvserve's FP8 path against the tool's own forward of the same checkpoint, as a
# share of the largest reference logit. With dynamic scales both quantize the same activations
# and multiply the same FP8 weights (measured: 5e-7 and 3e-7, float32 rounding). With static
# per-tensor scales kvserve, as vLLM, runs q/k/v (and gate/up) as one GEMM at the largest
# weight and input scale of the shards, where the tool quantizes each shard's input at its own
# scale (measured: 2.5%, top-1 agreement 97%).
LOGITS_TOLERANCE = {"fp8_dynamic": 1e-4, "fp8_block": 1e-4, "fp8_static": 0.04}


@pytest.fixture(scope="module")
def engines() -> dict:
    return {name: cpu_engine(FIXTURES / name) for name in LAYOUTS}


def _layer_and_rows(model: torch.nn.Module, name: str) -> tuple[Linear, slice]:
    module, _, _ = name.rpartition(".")
    shard = 0
    for fragment, (merged, index) in STACKED_PARAMS.items():
        if module.endswith(f".{fragment}"):
            module, shard = module[: -len(fragment)] + merged, index
    layer = model.get_submodule(module)
    return layer, shard_rows(layer, shard)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_weights_dequantize_as_compressed_tensors_does(layout: str, engines: dict) -> None:
    from safetensors.torch import load_file

    args = QuantizationArgs(**fixture_config(layout)["config_groups"]["group_0"]["weights"])
    tensors = load_file(str(FIXTURES / layout / "model.safetensors"))
    model = engines[layout].runner.model
    checked = 0
    for name, q in tensors.items():
        if not name.endswith("proj.weight"):
            continue
        scale = tensors[name + "_scale"]
        ref = dequantize(q, scale.float(), args=args, dtype=torch.float32)
        layer, rows = _layer_and_rows(model, name)
        ours = dequantize_fp8_weight(layer.weight, layer.weight_scale, layer.method.spec.block)
        if layout == "fp8_static" and len(layer.shard_sizes) > 1:
            # per-tensor shards were requantized to the largest shard scale: one more rounding
            top = layer.weight_scale.item()
            torch.testing.assert_close(ours[rows], ref, rtol=0.07, atol=top * 2**-6)
        else:
            torch.testing.assert_close(ours[rows], ref, rtol=0, atol=0)
        checked += 1
    assert checked == 7  # q, k, v, o, gate, up, down


@pytest.mark.parametrize("group", [None, 128])
def test_dynamic_activation_scales_as_compressed_tensors_computes_them(group: int | None) -> None:
    torch.manual_seed(0)
    x = torch.randn(6, 256) * torch.logspace(-2, 1, 6)[:, None]
    strategy = {"strategy": "group", "group_size": group} if group else {"strategy": "token"}
    args = QuantizationArgs(num_bits=8, type="float", symmetric=True, dynamic=True, **strategy)
    g = group or 256
    grouped = x.view(6, 256 // g, g)
    scale, zero = calculate_qparams(grouped.amin(-1), grouped.amax(-1), args)
    q_ref = quantize(grouped, scale[..., None], zero[..., None], args, dtype=torch.float8_e4m3fn)
    q, s = quantize_fp8_reference(x, group)
    torch.testing.assert_close(s, scale.float().view(s.shape), rtol=1e-6, atol=0)
    torch.testing.assert_close(q.float(), q_ref.float().view(6, 256), rtol=0, atol=0)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_logits_match_the_tools_own_forward(layout: str, engines: dict) -> None:
    import transformers

    ref_model = transformers.AutoModelForCausalLM.from_pretrained(
        str(FIXTURES / layout), dtype=torch.float32
    ).eval()
    with torch.no_grad():
        ref = ref_model(torch.tensor([PROMPT])).logits[0]
    ours = prefill_logits(engines[layout], PROMPT)
    err = (ours - ref).abs().max() / ref.abs().max()
    assert err < LOGITS_TOLERANCE[layout], err
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9


def _modelopt_checkpoint(tiny_model_dir, tmp_path) -> tuple[str, dict]:  # noqa: ANN001
    """A tiny Llama in the ModelOpt FP8 layout: per-tensor weights quantized with
    compressed-tensors, scalar weight_scale and input_scale per projection (q, k and v each with
    their own, so kvserve must requantize them to one), hf_quant_config.json beside config.json
    (as ModelOpt exports write it). Returns the path and {module: (weight, input_scale)}."""
    from safetensors.torch import load_file, save_file

    src = tiny_model_dir("LlamaForCausalLM")
    out = tmp_path / "modelopt"
    out.mkdir()
    for f in src.iterdir():
        if f.name != "model.safetensors":
            (out / f.name).write_bytes(f.read_bytes())
    args = QuantizationArgs(num_bits=8, type="float", strategy="tensor", symmetric=True)
    tensors, saved, reference = load_file(str(src / "model.safetensors")), {}, {}
    for i, (name, w) in enumerate(sorted(tensors.items())):
        if not name.endswith("proj.weight"):
            saved[name] = w
            continue
        scale, zero = calculate_qparams(w.amin().reshape(1), w.amax().reshape(1), args)
        q = quantize(w, scale, zero, args, dtype=torch.float8_e4m3fn)
        in_scale = torch.tensor(0.01 + 0.002 * (i % 5))  # uneven, as calibration would give
        module = name.removesuffix(".weight")
        saved.update({name: q, f"{module}.weight_scale": scale.reshape(()),
                      f"{module}.input_scale": in_scale})  # fmt: skip
        reference[module] = (dequantize(q, scale, args=args, dtype=torch.float32), in_scale)
    for layer in {n.split(".self_attn.")[0] for n in reference if ".self_attn." in n}:
        saved[f"{layer}.self_attn.k_proj.k_scale"] = torch.tensor(1.0)  # FP8-KV scales, unused
        saved[f"{layer}.self_attn.v_proj.v_scale"] = torch.tensor(1.0)
    save_file(saved, str(out / "model.safetensors"))
    hf_quant = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8"}}
    (out / "hf_quant_config.json").write_text(json.dumps(hf_quant))
    return str(out), reference


def test_modelopt_layout_matches_compressed_tensors_fake_quant(tiny_model_dir, tmp_path) -> None:
    """Reference: transformers with the dequantized weights and each projection's input
    fake-quantized by compressed-tensors at the static scale of its shard."""
    import transformers

    path, reference = _modelopt_checkpoint(tiny_model_dir, tmp_path)
    core = cpu_engine(path)
    assert core.runner.model.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.float8_e4m3fn
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(tiny_model_dir("LlamaForCausalLM")), dtype=torch.float32
    ).eval()
    static = QuantizationArgs(num_bits=8, type="float", strategy="tensor", symmetric=True)
    qkv_scale = {}  # kvserve takes the largest input scale of q/k/v (and of gate/up)
    for module, (_, s) in reference.items():
        group = module.rsplit(".", 1)[0] + (".mlp" if "mlp" in module else ".attn")
        if not module.endswith(("o_proj", "down_proj")):
            qkv_scale[group] = max(qkv_scale.get(group, s), s)
    for module, (w, s) in reference.items():
        linear = model.get_submodule(module)
        linear.weight.data.copy_(w)
        group = module.rsplit(".", 1)[0] + (".mlp" if "mlp" in module else ".attn")
        scale = qkv_scale.get(group, s) if not module.endswith(("o_proj", "down_proj")) else s
        linear.register_forward_pre_hook(
            lambda _m, inp, scale=scale: (fake_quantize(inp[0], scale, torch.zeros(()), static),)
        )
    with torch.no_grad():
        ref = model(torch.tensor([PROMPT])).logits[0]
    ours = prefill_logits(core, PROMPT)
    err = (ours - ref).abs().max() / ref.abs().max()
    assert err < 0.05  # per-tensor q/k/v weights were requantized to one scale (one rounding)
