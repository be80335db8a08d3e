"""GLM-4.5 / 4.6 MoE: grouped sigmoid routing with a score-correction bias, a shared expert,
dense first layers, rotary over half of each head, q/k/v biases (all from ``ModelConfig``).
Checkpoints also hold multi-token-prediction layers past ``num_hidden_layers``
(``num_nextn_predict_layers``), which plain decoding does not use: they are skipped."""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch

from kvserve.models.decoder import DecoderForCausalLM

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


class Glm4MoeForCausalLM(DecoderForCausalLM):
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        num_layers = self.config.num_layers
        super().load_weights((n, t) for n, t in weights if not _beyond(n, num_layers))


def _beyond(name: str, num_layers: int) -> bool:
    match = _LAYER.match(name)
    return match is not None and int(match.group(1)) >= num_layers
