"""Qwen3: the decoder with an RMSNorm over each head of q and k (ModelConfig.qk_norm)."""

from __future__ import annotations

from kvserve.models.decoder import DecoderForCausalLM


class Qwen3ForCausalLM(DecoderForCausalLM):
    pass
