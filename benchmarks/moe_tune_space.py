"""The search space of ``moe_tune``: which steps are tuned, the heuristic tile each is compared
with (the engine's without a table), and the candidate tiles: per ``BLOCK_M`` for the grouped
GEMMs, the word GEMV's tiles and K splits for FP4 decode steps (and FP8 / bf16 ones with
``KVSERVE_FP8_MOE_GEMV=1`` / ``KVSERVE_BF16_MOE_GEMV=1``)."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from benchmarks.moe_gemm import moe_shape, stacked
from kvserve.kernels.fused_moe import _block_config, half_weight_config, one_slot_per_block
from kvserve.kernels.fused_moe_fp4 import fp4_path
from kvserve.kernels.fused_moe_fp8 import fp8_kind, fp8_moe_gemv_enabled, launch_tile
from kvserve.kernels.fused_moe_half_gemv import half_moe_gemv_enabled
from kvserve.kernels.moe_tiles import GEMV_KEYS, TILE_KEYS, MoeShape
from kvserve.kernels.word_gemv import GEMV_TILES, gemv_config

FP8_BLOCK = (128, 128)
FP4_FORMATS = ("nvfp4", "mxfp4")
TOKENS = "1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192"
SMEM_BYTES = 227 * 1024  # the H100/H200 opt-in shared memory a block
# bytes an element of (A, W) in shared memory
OPERAND_BYTES = {"bf16": (2, 2), "fp8": (1, 1), "fp8-channel": (1, 1), "nvfp4": (2, 0.5),
                 "mxfp4": (2, 0.5)}  # fmt: skip


@dataclass(frozen=True)
class Step:
    model: str
    fmt: str
    tokens: int


def shape_of(model: str, tp: int) -> dict[str, int]:
    shape = moe_shape(model)
    return shape | {"inter": shape["inter"] // tp}


def shape_key(fmt: str, shape: dict[str, int], gemv: bool = False) -> MoeShape:
    kinds = {"bf16": "bfloat16", "fp8": fp8_kind(FP8_BLOCK), "fp8-channel": fp8_kind(None)}
    kind = kinds.get(fmt, fmt) + ("_gemv" if gemv else "")
    return MoeShape(kind, shape["experts"], 2 * shape["inter"], shape["hidden"], shape["top_k"])


def on_gemv(fmt: str, slots: int, experts: int) -> bool:
    """FP4 and FP8 decode steps run the word GEMV (``fused_moe_fp4``, ``fused_moe_fp8``; off
    with their switches at 0), bf16 ones with ``KVSERVE_BF16_MOE_GEMV=1``
    (``fused_moe_half_gemv``)."""
    if fmt.startswith("fp8"):
        return one_slot_per_block(slots, experts) and fp8_moe_gemv_enabled()
    if fmt == "bf16":
        return one_slot_per_block(slots, experts) and half_moe_gemv_enabled()
    return fmt in FP4_FORMATS and fp4_path(slots, experts) == "gemv"


def heuristic_tile(fmt: str, slots: int, experts: int) -> dict[str, int]:
    """The tile the engine runs without a table (``fused_moe*``), as the kernel launches it;
    the GEMV's is ``{}``, its own default."""
    if on_gemv(fmt, slots, experts):
        return {}
    tile = _block_config(slots, experts)
    if fmt == "bf16":
        return half_weight_config(tile, torch.bfloat16)
    if fmt == "fp8":
        return launch_tile(tile, FP8_BLOCK)
    return tile


def block_ms(slots: int, experts: int) -> list[int]:
    """The sort blocks worth timing: about the slots an expert, never past 128."""
    if one_slot_per_block(slots, experts):
        return [16]
    per_expert = max(1, slots // experts)
    top = max(16, min(128, 2 * per_expert))
    bottom = max(16, min(64, per_expert // 4))
    return [m for m in (16, 32, 64, 128) if bottom <= m <= top]


def warp_counts(block_m: int, block_n: int) -> tuple[int, ...]:
    if block_m * block_n <= 64 * 64:
        return (4,)
    return (8,) if block_m * block_n >= 128 * 256 else (4, 8)


def candidate_tiles(fmt: str, block_m: int) -> list[dict[str, int]]:
    """Tiles of one BLOCK_M: wide K and narrow N for short M (weight-bound), larger N and more
    warps for long M; those that overflow shared memory are left out."""
    if fmt == "fp8":  # block-wise scales: BLOCK_K is the scale block, BLOCK_N within it
        ns, ks = (32, 64, 128) if block_m == 16 else (64, 128), (FP8_BLOCK[1],)
    elif block_m == 16:
        ns, ks = (32, 64, 128), (128, 256)
    else:
        ns, ks = (64, 128, 256), (64, 128)
    a_bytes, w_bytes = OPERAND_BYTES[fmt]
    tiles = []
    for n, k, stages in itertools.product(ns, ks, (3, 4, 5) if block_m == 16 else (3, 4)):
        if stages * (block_m * k * a_bytes + n * k * w_bytes) > SMEM_BYTES:
            continue
        for warps in warp_counts(block_m, n):
            tiles.append(dict(zip(TILE_KEYS, (block_m, n, k, warps, stages), strict=True)))
    return tiles


def gemv_tiles(n: int, words: int, slots: int, num_sms: int) -> list[dict[str, int]]:
    """The word GEMV's tiles for one GEMM of a decode step: ``GEMV_TILES`` at 4, 8 and 2
    programs an SM (K split to match), as ``word_gemv.gemv_candidates`` tries them for dense
    layers."""
    tiles: list[dict[str, int]] = []
    for per_sm, (block_n, block_w, warps) in itertools.product((4, 8, 2), GEMV_TILES):
        cfg = gemv_config(n, words, num_sms=num_sms, block_n=block_n, block_w=block_w,
                          num_warps=warps, programs_per_sm=per_sm, slots=slots)  # fmt: skip
        tile = {key: getattr(cfg, key) for key in GEMV_KEYS}
        if tile not in tiles:
            tiles.append(tile)
    return tiles


def step_candidates(step: Step, shape: dict[str, int], num_sms: int,
                    ) -> dict[int, tuple[list, list]]:  # fmt: skip
    """{group: (gate/up tiles, down tiles)}: a group per BLOCK_M, or one (0) of GEMV tiles."""
    per_token, experts = stacked(shape)
    slots = step.tokens * per_token
    if on_gemv(step.fmt, slots, experts):
        h, inter = shape["hidden"], shape["inter"]
        per_word = round(4 / OPERAND_BYTES[step.fmt][1])  # W's values a 32-bit word holds
        gate_up, down = (2 * inter, h // per_word), (h, inter // per_word)
        return {0: (gemv_tiles(*gate_up, slots, num_sms), gemv_tiles(*down, slots, num_sms))}
    return {m: (candidate_tiles(step.fmt, m),) * 2 for m in block_ms(slots, experts)}


@functools.cache
def num_sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


def tuned_steps(models: list[str], formats: list[str], tokens: list[int], tp: int,
                ) -> Iterator[tuple[Step, dict[str, int]]]:  # fmt: skip
    for model, fmt, t in itertools.product(models, formats, tokens):
        shape = shape_of(model, tp)
        if fmt == "fp8" and shape["inter"] % FP8_BLOCK[0]:
            if t == tokens[0]:  # the engine refuses this shard too (moe_fp8: check_divides)
                print(f"{model} fp8 at --tp {tp}: skipped, the experts' intermediate size "
                      f"{shape['inter']} is not a multiple of {FP8_BLOCK[0]}")  # fmt: skip
            continue
        per_token, experts = stacked(shape)
        if fmt in FP4_FORMATS and fp4_path(t * per_token, experts) == "dequantized":
            continue  # bf16's GEMM on dequantized experts: tuned as bf16
        yield Step(model, fmt, t), shape
