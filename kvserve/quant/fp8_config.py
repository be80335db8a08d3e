"""What an FP8 checkpoint (or ``--quantization fp8``) means: weight-scale granularity,
activation scaling, and the checkpoint's tensor names. One ``Fp8Spec`` per model."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvserve.quant.schemes import QuantConfig, UnsupportedQuantization

WEIGHT_STRATEGIES = ("tensor", "channel", "block")
# "static": a per-tensor input_scale from the checkpoint; "token"/"group": dynamic per token
# (per group of block[1] columns); "tensor": dynamic per tensor; "none": weight-only.
ACTIVATIONS = ("static", "token", "group", "tensor", "none")


@dataclass(frozen=True)
class Fp8Spec:
    weight: str
    activation: str
    block: tuple[int, int] | None = None  # (rows, cols) of one weight scale when "block"
    scale_name: str = "weight_scale"  # the checkpoint's name ("weight_scale_inv": Qwen3/DSv3)
    online: bool = False

    def __post_init__(self) -> None:
        if self.weight not in WEIGHT_STRATEGIES or self.activation not in ACTIVATIONS:
            raise UnsupportedQuantization(f"fp8 with {self.weight} weights, {self.activation}")
        if (self.weight == "block") != (self.block is not None):
            raise UnsupportedQuantization("fp8 block weights need a block size and only they")
        if self.activation == "group" and self.weight != "block":
            raise UnsupportedQuantization("fp8 per-group activations need block-wise weights")

    @property
    def act_group(self) -> int | None:
        return self.block[1] if self.activation == "group" and self.block else None


def _refuse(source: str, what: str) -> UnsupportedQuantization:
    return UnsupportedQuantization(
        f"fp8 ({source}): {what} is not supported; kvserve runs fp8 with per-tensor, "
        "per-channel or block-wise symmetric weights and static per-tensor, dynamic per-token "
        "or per-group activations"
    )


def _ct_activation(acts: Mapping[str, Any], block: tuple[int, int] | None, source: str) -> str:
    if not acts:
        return "none"
    if (acts.get("type", "float"), int(acts.get("num_bits", 8))) != ("float", 8):
        raise _refuse(source, f"{acts.get('num_bits')}-bit {acts.get('type')} activations")
    strategy, dynamic = acts.get("strategy", "tensor"), bool(acts.get("dynamic", False))
    if strategy == "tensor":
        return "tensor" if dynamic else "static"
    if strategy == "token" and dynamic:
        return "token"
    if strategy == "group" and dynamic and block and acts.get("group_size") == block[1]:
        return "group"
    raise _refuse(source, f"{'dynamic' if dynamic else 'static'} {strategy} activations")


def _compressed_tensors(config: QuantConfig) -> Fp8Spec:
    weights, source = config.params.get("weights") or {}, config.source
    if (weights.get("type"), int(weights.get("num_bits", 0))) != ("float", 8):
        raise _refuse(source, f"{weights.get('num_bits')}-bit {weights.get('type')} weights")
    if not weights.get("symmetric", True) or weights.get("dynamic", False):
        raise _refuse(source, "asymmetric or dynamic weights")
    strategy = weights.get("strategy", "tensor")
    block = None
    if strategy == "block":
        structure = weights.get("block_structure") or [128, 128]
        block = (int(structure[0]), int(structure[1]))
    elif strategy not in ("tensor", "channel"):
        raise _refuse(source, f"{strategy} weight scales")
    activation = _ct_activation(config.params.get("input_activations") or {}, block, source)
    return Fp8Spec(strategy, activation, block)


def _native(config: QuantConfig) -> Fp8Spec:
    """``quant_method: fp8``: block-wise with dynamic groups (Qwen3-FP8, DeepSeek-V3), or
    per-tensor weights with static or dynamic activations."""
    scheme = str(config.params.get("activation_scheme", "dynamic"))
    block = config.params.get("weight_block_size")
    if block:
        if scheme != "dynamic":
            raise _refuse(config.source, f"block-wise weights with {scheme} activations")
        return Fp8Spec("block", "group", (int(block[0]), int(block[1])), "weight_scale_inv")
    return Fp8Spec("tensor", "static" if scheme == "static" else "token")


def fp8_spec(config: QuantConfig) -> Fp8Spec:
    if config.layout == "online":
        return Fp8Spec("channel", "token", online=True)
    if config.layout == "compressed-tensors":
        return _compressed_tensors(config)
    if config.layout == "modelopt":
        return Fp8Spec("tensor", "static")
    if config.layout == "fp8":
        return _native(config)
    raise _refuse(config.source, f"the {config.layout} layout")
