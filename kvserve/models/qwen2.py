"""Qwen2: the decoder with a bias on the q/k/v projections (ModelConfig.attention_bias)."""

from __future__ import annotations

from kvserve.models.decoder import DecoderForCausalLM


class Qwen2ForCausalLM(DecoderForCausalLM):
    pass
