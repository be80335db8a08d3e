"""Llama 2/3, SmolLM2, Mistral-style models: the plain decoder."""

from __future__ import annotations

from kvserve.models.decoder import DecoderForCausalLM


class LlamaForCausalLM(DecoderForCausalLM):
    pass
