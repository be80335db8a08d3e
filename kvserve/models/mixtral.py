"""Mixtral: the Llama decoder whose every MLP is a mixture of experts with a softmax router
whose top-k weights are renormalised (``ModelConfig.moe``); its checkpoints name the layer
``block_sparse_moe`` and the experts' projections ``w1`` / ``w3`` / ``w2``."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from kvserve.loader.mixtral_names import decoder_name
from kvserve.models.decoder import DecoderForCausalLM


class MixtralForCausalLM(DecoderForCausalLM):
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights((decoder_name(n), t) for n, t in weights)
