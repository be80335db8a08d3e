"""Mixtral's checkpoint spelling (``block_sparse_moe``, experts' ``w1`` / ``w3`` / ``w2``) read as
the decoder's, for its tensors and for the layers its quantization config leaves out. Its
logits and greedy tokens against transformers are in test_tiny_models_vs_hf.py and
test_moe_models.py."""

from __future__ import annotations

import json

import pytest
import torch

from kvserve import LLM, SamplingParams
from kvserve.loader.mixtral_names import decoder_name, decoder_quantization


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("model.layers.3.block_sparse_moe.gate.weight", "model.layers.3.mlp.gate.weight"),
        ("model.layers.3.block_sparse_moe.experts.7.w1.weight",
         "model.layers.3.mlp.experts.7.gate_proj.weight"),
        ("model.layers.3.block_sparse_moe.experts.7.w3.weight_scale",
         "model.layers.3.mlp.experts.7.up_proj.weight_scale"),
        ("model.layers.3.block_sparse_moe.experts.7.w2.input_scale",
         "model.layers.3.mlp.experts.7.down_proj.input_scale"),
        ("model.layers.*.block_sparse_moe.experts.*.w2", "model.layers.*.mlp.experts.*.down_proj"),
        ("re:.*block_sparse_moe.gate$", "re:.*mlp.gate$"),
        ("model.layers.3.self_attn.q_proj.weight", "model.layers.3.self_attn.q_proj.weight"),
        ("lm_head", "lm_head"),
    ],
)  # fmt: skip
def test_checkpoint_names_become_the_decoders(name: str, expected: str) -> None:
    assert decoder_name(name) == expected


def test_the_layers_left_unquantized_are_renamed_at_either_level() -> None:
    ct = {"quant_method": "compressed-tensors", "ignore": ["lm_head", "re:.*block_sparse_moe.gate"]}
    assert decoder_quantization(ct)["ignore"] == ["lm_head", "re:.*mlp.gate"]
    modelopt = {"quantization": {"quant_algo": "FP8", "exclude_modules": ["*block_sparse_moe*"]}}
    assert decoder_quantization(modelopt)["quantization"]["exclude_modules"] == ["*mlp*"]
    assert decoder_quantization(None) is None


def test_a_mixtral_layer_left_out_by_its_checkpoint_name_stays_unquantized(tmp_path) -> None:
    """Block-wise FP8 with layer 1's MoE block named in ``modules_to_not_convert`` as Mixtral
    checkpoints spell it: layer 0's experts load as FP8, layer 1's in the model dtype."""
    config = {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 256,
        "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "num_local_experts": 4,
        "num_experts_per_tok": 2, "vocab_size": 512, "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "sliding_window": None,
        "quantization_config": {
            "quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic",
            "modules_to_not_convert": ["lm_head", "model.layers.1.block_sparse_moe"],
        },
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    llm = LLM(model=str(tmp_path), device="cpu", load_format="dummy", max_total_tokens=512)
    moes = [m for m in llm.engine.runner.model.modules() if type(m).__name__ == "SparseMoE"]
    assert [m.w13.dtype for m in moes] == [torch.float8_e4m3fn, torch.float32]
    out = llm.generate([[5, 6, 7, 8]], SamplingParams(temperature=0, max_tokens=4))
    assert len(out[0].token_ids) == 4
