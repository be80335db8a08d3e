"""``load_format="dummy"``: random weights from a config.json alone (for benchmarks at real
sizes without weight files)."""

from __future__ import annotations

import json

from engine_checks import assert_engine_clean

from kvserve import LLM, SamplingParams

TINY_QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 1000,
    "max_position_embeddings": 512,
    "eos_token_id": 0,
}


def test_dummy_weights_from_config_only(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(TINY_QWEN3))
    llm = LLM(model=str(tmp_path), load_format="dummy", device="cpu")
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    first = llm.generate([[5, 6, 7, 8]], params)[0].token_ids
    assert len(first) == 8 and all(0 <= t < 1000 for t in first)
    assert llm.generate([[5, 6, 7, 8]], params)[0].token_ids == first  # deterministic
    assert_engine_clean(llm.engine)
