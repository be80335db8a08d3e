from __future__ import annotations

from pathlib import Path

import pytest
import torch
from model_factory import ROPE_SCALINGS, make_tiny_model
from safetensors.torch import load_file

from kvserve.loader import GenerationDefaults, open_model_source

ARCHS = ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"]


def reference_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for file in sorted(directory.glob("*.safetensors")):
        state.update(load_file(str(file)))
    return state


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_model_config_and_weights_round_trip(arch: str, tmp_path: Path) -> None:
    directory = make_tiny_model(arch, tmp_path / arch, num_layers=3)
    src = open_model_source(str(directory))
    cfg = src.config
    assert src.format == "hf" and src.path == str(directory.resolve())
    assert (cfg.architecture, cfg.vocab_size, cfg.hidden_size) == (arch, 49152, 64)
    assert (cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (3, 4, 2, 16)
    assert (cfg.intermediate_size, cfg.max_position_embeddings) == (128, 4096)
    assert cfg.rope_theta == 10000.0 and cfg.rope_scaling is None
    assert cfg.attention_bias == (arch == "Qwen2ForCausalLM")
    assert cfg.qk_norm == (arch == "Qwen3ForCausalLM")
    assert cfg.tie_word_embeddings is False
    assert cfg.eos_token_ids == (2,) and cfg.bos_token_id == 1
    assert src.generation_defaults == GenerationDefaults(
        temperature=0.7, top_p=0.9, eos_token_ids=(2,)
    )

    ours = dict(src.weights())
    ref = reference_state_dict(directory)
    assert set(ours) == set(ref)
    assert "lm_head.weight" in ours
    assert any(name.endswith("q_proj.bias") for name in ours) == (arch == "Qwen2ForCausalLM")
    assert any(name.endswith("q_norm.weight") for name in ours) == (arch == "Qwen3ForCausalLM")
    for name, tensor in ours.items():
        assert tensor.dtype == torch.float32
        assert torch.equal(tensor, ref[name]), name


def test_sharded_checkpoint_and_tied_embeddings(tmp_path: Path) -> None:
    directory = make_tiny_model(
        "LlamaForCausalLM", tmp_path, tie_word_embeddings=True, max_shard_size="1MB"
    )
    assert (directory / "model.safetensors.index.json").is_file()
    assert len(list(directory.glob("*.safetensors"))) > 1
    src = open_model_source(str(directory))
    assert src.config.tie_word_embeddings is True
    ours = dict(src.weights())
    ref = reference_state_dict(directory)
    assert "lm_head.weight" not in ours
    assert set(ours) == set(ref)
    assert all(torch.equal(ours[name], ref[name]) for name in ref)


@pytest.mark.parametrize("kind", sorted(ROPE_SCALINGS))
def test_rope_scaling_variants(kind: str, tmp_path: Path) -> None:
    directory = make_tiny_model("LlamaForCausalLM", tmp_path, num_layers=1, rope_scaling=kind)
    scaling = open_model_source(str(directory)).config.rope_scaling
    assert scaling == ROPE_SCALINGS[kind]
    assert "rope_theta" not in scaling


def test_legacy_rope_scaling_key_and_head_dim_default(tmp_path: Path) -> None:
    import json

    directory = make_tiny_model("LlamaForCausalLM", tmp_path, num_layers=1)
    data = json.loads((directory / "config.json").read_text())
    del data["rope_parameters"], data["head_dim"], data["num_key_value_heads"]
    data["rope_theta"] = 500000.0
    data["rope_scaling"] = {"type": "linear", "factor": 4.0}
    data["quantization_config"] = {"quant_method": "fp8"}
    (directory / "config.json").write_text(json.dumps(data))
    cfg = open_model_source(str(directory)).config
    assert cfg.rope_theta == 500000.0
    assert cfg.rope_scaling == {"rope_type": "linear", "factor": 4.0}
    assert cfg.head_dim == 64 // 4 and cfg.num_kv_heads == 4
    assert cfg.quantization == {"quant_method": "fp8"}


def test_qwen2_bias_implied_when_key_absent(tmp_path: Path) -> None:
    import json

    directory = make_tiny_model("Qwen2ForCausalLM", tmp_path, num_layers=1)
    data = json.loads((directory / "config.json").read_text())
    assert "attention_bias" not in data
    assert open_model_source(str(directory)).config.attention_bias is True


def test_tokenizer_and_chat_template_from_directory(tmp_path: Path) -> None:
    template = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
    directory = make_tiny_model("Qwen3ForCausalLM", tmp_path, num_layers=1, chat_template=template)
    tok = open_model_source(str(directory)).tokenizer
    messages = [{"role": "user", "content": "hi"}]
    assert tok.chat_template == template
    assert tok.apply_chat_template(messages) == "[user]hi"
    assert tok.apply_chat_template(messages) == tok.hf.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    assert tok.encode("Hello world") == [19556, 905]
    assert tok.eos_token_ids == (2,)
