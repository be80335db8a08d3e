"""Qwen3-MoE: the Qwen3 decoder (q/k norm) whose MLPs are sparse mixtures of experts with a
softmax router (``ModelConfig.moe``); ``mlp_only_layers`` / ``decoder_sparse_step`` keep some
layers dense."""

from __future__ import annotations

from kvserve.models.decoder import DecoderForCausalLM


class Qwen3MoeForCausalLM(DecoderForCausalLM):
    pass
