"""Every ``KVSERVE_*`` environment setting the package reads, in one table: its default, what it
does, and the reader that parses it. Each module keeps its own reader (most cache it and read it
once, at load); this table is what ``kvserve preflight`` checks before a start, what the README
lists, and what a test holds the source to (no ``KVSERVE_*`` name outside it).

A reader raises ``ConfigError`` on a value it refuses; ``read_setting`` clears a cached
reader first, so the value in the environment now is the one checked. ``check_environment``
runs every set one's reader when an engine starts, so a bad value fails the start with one
line, not the first step that reads it.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path

from kvserve.errors import ConfigError

NOT_CHECKED = "not checked"


@dataclass(frozen=True)
class EnvSetting:
    name: str
    default: str  # what it means unset
    meaning: str
    reader: str = ""  # "module:function" that parses it; "" when any value is taken
    secret: bool = False  # never printed
    directory: bool = False  # names a directory that must exist


SETTINGS: tuple[EnvSetting, ...] = (
    EnvSetting(
        name="KVSERVE_API_KEY",
        default="none",
        meaning="the key clients must send when --api-key is not given",
        secret=True,
    ),
    EnvSetting(
        name="KVSERVE_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN",
        default="0",
        meaning="1 serves a --context-length past the model's positions",
        reader="kvserve.config:allow_longer_context",
    ),
    EnvSetting(
        name="KVSERVE_CACHE_DIR",
        default="$XDG_CACHE_HOME/kvserve",
        meaning="where derived model data is cached (empty: off)",
    ),
    EnvSetting(
        name="KVSERVE_DIST_TIMEOUT_S",
        default="300",
        meaning="seconds a collective may wait before the group fails",
        reader="kvserve.distributed.process_group:collective_timeout_s",
    ),
    EnvSetting(
        name="KVSERVE_MOE_CONFIG_DIR",
        default="none",
        meaning="a directory of tuned MoE tile tables, read before the shipped ones",
        directory=True,
    ),
    EnvSetting(
        name="KVSERVE_MOE_TUNED",
        default="1",
        meaning="0 ignores the tuned MoE tile tables",
        reader="kvserve.kernels.moe_tiles:_tables_on",
    ),
    EnvSetting(
        name="KVSERVE_SHARED_EXPERT_FUSION",
        default="1",
        meaning="0 keeps a shared expert out of the expert stacks",
        reader="kvserve.layers.moe:shared_expert_fusion",
    ),
    EnvSetting(
        name="KVSERVE_NORM_ROUTER",
        default="1",
        meaning="0 runs a MoE decode step's post-attention norm apart from its router kernel",
        reader="kvserve.layers.moe_router:norm_router_enabled",
    ),
    EnvSetting(
        name="KVSERVE_GATED_GEMV",
        default="1",
        meaning="0 runs the SiLU-mul after a gate/up GEMV in its own kernel",
        reader="kvserve.kernels.word_gemv:gated_gemv_enabled",
    ),
    EnvSetting(
        name="KVSERVE_FP4_ASYNC",
        default="auto",
        meaning="FP4 steps of 17-128 rows the asynchronous-MMA kernel takes (Hopper): 0 none, "
        "auto where it was faster (W tiles filling the SMs; long K splits, by rows, format and "
        "x's producer), 1 all",
        reader="kvserve.kernels.fp4_async_choice:async_gemm_mode",
    ),
    EnvSetting(
        name="KVSERVE_FP4_ASYNC_BITS",
        default="1",
        meaning="0: the asynchronous-MMA FP4 kernel decodes W by the e4m3 trick, not bit placement",
        reader="kvserve.kernels.fp4_async_choice:async_bits_enabled",
    ),
    EnvSetting(
        name="KVSERVE_FP4_PERMUTE_IN_PRODUCER",
        default="1",
        meaning="0: the asynchronous-MMA FP4 kernel permutes x by a kernel of its own, not "
        "the RMSNorm or SiLU-mul before it",
        reader="kvserve.kernels.fp4_async_choice:permute_in_producer",
    ),
    EnvSetting(
        name="KVSERVE_FP4_MOE_GEMV",
        default="1",
        meaning="0 runs FP4 experts' decode steps on the grouped MMA kernel",
        reader="kvserve.kernels.fused_moe_fp4:moe_gemv_enabled",
    ),
    EnvSetting(
        name="KVSERVE_FP8_MOE_GEMV",
        default="1",
        meaning="0 runs FP8 experts' decode steps on the grouped tensor-core kernel",
        reader="kvserve.kernels.fused_moe_fp8:fp8_moe_gemv_enabled",
    ),
    EnvSetting(
        name="KVSERVE_BF16_MOE_GEMV",
        default="0",
        meaning="1 runs 16-bit experts' decode steps on the word GEMV",
        reader="kvserve.kernels.fused_moe_half_gemv:half_moe_gemv_enabled",
    ),
    EnvSetting(
        name="KVSERVE_BF16_GEMV_ROWS",
        default="1 token for weights of <= 12M values",
        meaning="16-bit layers take the word GEMV up to this many tokens (0-4)",
        reader="kvserve.quant.unquantized:gemv_max_rows",
    ),
    EnvSetting(
        name="KVSERVE_BF16_SKINNY_ROWS",
        default="0",
        meaning="16-bit layers take the swap-AB kernel up to this many tokens (0-64)",
        reader="kvserve.quant.unquantized:skinny_max_rows",
    ),
    EnvSetting(
        name="KVSERVE_FP8_W8A16_ROWS",
        default="1",
        meaning="FP8 layers run weight-only on the word GEMV up to this many tokens (0-4)",
        reader="kvserve.quant.fp8_method:w8a16_max_rows",
    ),
    EnvSetting(
        name="KVSERVE_PDL_EARLY_LOADS",
        default="1",
        meaning="0 has the decode attention and rotary kernels read nothing before their "
        "dependent-launch wait",
        reader="kvserve.kernels._triton:early_loads_enabled",
    ),
    EnvSetting(
        name="KVSERVE_ROUTER_L2_WARM",
        default="0",
        meaning="1 has a MoE decode step's norm + router kernel ask L2 for a stacked shared "
        "expert's gate/up rows once the kernel before is done",
        reader="kvserve.kernels.l2_warm:router_warm_enabled",
    ),
    EnvSetting(
        name="KVSERVE_FP8_Q_TERMS",
        default="1",
        meaning="2 takes q as two e4m3 terms in FP8-cache attention (more exact, slower)",
        reader="kvserve.kernels.fp8_attention_operands:q_terms_setting",
    ),
    EnvSetting(
        name="KVSERVE_COMPILE_WORKERS",
        default="auto",
        meaning="processes that compile the start's Triton kernels ahead of its warm-up (auto: "
        "half the CPUs, shared by a tensor-parallel group's ranks, at most 16 a rank; 0: off)",
        reader="kvserve.kernels.compile_ahead:compile_workers_setting",
    ),
    EnvSetting(
        name="KVSERVE_DECODE_BALANCED",
        default="1",
        meaning="0 splits decode attention by shapes alone, not by the batch's tokens",
        reader="kvserve.kernels.decode_attention:balanced_splits_enabled",
    ),
    EnvSetting(
        name="KVSERVE_FP8_SKINNY_ROWS",
        default="64",
        meaning="FP8 layers take the tensor-core decode kernel up to this many tokens (0-512)",
        reader="kvserve.quant.fp8_method:skinny_max_rows",
    ),
    EnvSetting(
        name="KVSERVE_FP8_SILU_QUANT",
        default="1",
        meaning="0 keeps the SiLU-mul kernel before an FP8 down projection's quantization",
        reader="kvserve.quant.fp8_method:silu_quant_enabled",
    ),
    EnvSetting(
        name="KVSERVE_FP8_NORM_QUANT",
        default="1",
        meaning="0 keeps the quantization kernel after the RMSNorm before an FP8 layer",
        reader="kvserve.quant.fp8_method:norm_quant_enabled",
    ),
    EnvSetting(
        name="KVSERVE_FP8_SKINNY_ROW_SCALE",
        default="1",
        meaning="0 quantizes x per 128-column group for per-channel FP8 steps of 33-64 tokens",
        reader="kvserve.quant.fp8_method:skinny_row_scale_enabled",
    ),
    EnvSetting(
        name="KVSERVE_FP8_SKINNY_PREFETCH",
        default="4",
        meaning="K steps of W (0, 1, 2, 4 or 8) the FP8 tensor-core decode kernel asks of L2 "
        "before it waits for the kernel before (33-64 tokens, per-channel or per-tensor weights)",
        reader="kvserve.kernels.fp8_skinny_gemm:skinny_prefetch_steps",
    ),
    EnvSetting(
        name="KVSERVE_FP8_BLOCK_CUBLAS_ROWS",
        default="1",
        meaning="128x128 block-scaled FP8 GEMMs of at least this many tokens on cuBLASLt (sm_90)"
        "; 0 keeps the Triton block GEMM",
        reader="kvserve.quant.fp8_method:block_cublas_min_rows",
    ),
)


def read_setting(setting: EnvSetting) -> str | None:
    """None when the value now in the environment is taken, else why it is refused."""
    value = os.environ.get(setting.name)
    if setting.directory:
        if not value or Path(value).is_dir():
            return None
        return f"{setting.name}={value!r} is not a directory"
    if not setting.reader:
        return None
    module, function = setting.reader.split(":")
    try:
        reader = getattr(importlib.import_module(module), function)
    except ImportError as exc:  # e.g. torch missing where only preflight runs
        return f"{NOT_CHECKED}: {exc}"
    if hasattr(reader, "cache_clear"):
        reader.cache_clear()
    try:
        reader()
    except ConfigError as exc:
        return str(exc)
    finally:
        if hasattr(reader, "cache_clear"):
            reader.cache_clear()
    return None


def check_environment() -> None:
    """Raises ``ConfigError`` for the first setting set to a value the engine refuses (a missing
    ``directory`` is not refused: the engine warns and keeps its default)."""
    for setting in SETTINGS:
        if setting.name in os.environ and not setting.directory:
            problem = read_setting(setting)
            if problem and not problem.startswith(NOT_CHECKED):
                raise ConfigError(problem)


def shown(setting: EnvSetting, value: str) -> str:
    return "<set>" if setting.secret else value


def settings_set() -> dict[str, str]:
    """The settings set in the environment now, name -> value (a secret's value hidden)."""
    return {s.name: shown(s, os.environ[s.name]) for s in SETTINGS if s.name in os.environ}


def settings_in_effect() -> str:
    """``settings_set`` as ``NAME=value, ...`` for the engine's startup line; empty when every
    setting is at its default."""
    return ", ".join(f"{name}={value}" for name, value in settings_set().items())
