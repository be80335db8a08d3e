"""Launch choices the Triton kernels make on the host, from shapes alone: how many key splits a
prefill chunk gets (and that the start-up warm-up reaches a split), which GEMV config and scale
loads a format takes, whether MoE decode steps go to the GEMV, and that a model's linear layers
take programmatic dependent launch from its kernel options. Plain Python: these run without
Triton or a GPU (the kernels themselves are tested in tests/gpu)."""

from __future__ import annotations

import itertools

import pytest
import torch

from kvserve.config import ModelConfig
from kvserve.engine.runner.warmup import STEPS, decode_steps, step_shapes
from kvserve.kernels import fused_moe_fp4
from kvserve.kernels.decode_attention import (
    FP8_DECODE_CONFIG,
    SPLIT_COUNT_TABLE_TOKENS,
    DecodeConfig,
    _split_plan,
    launch_variant,
)
from kvserve.kernels.fp4_dequantize import DequantGemmConfig
from kvserve.kernels.fp4_gemm import (
    DEQUANT_GEMM_MIN_ROWS,
    Fp4GemmConfig,
    block_m_for,
    candidate_configs,
    default_config,
    mma_config,
)
from kvserve.kernels.fp4_reference import MXFP4_GROUP, NVFP4_GROUP
from kvserve.kernels.options import KernelOptions
from kvserve.kernels.prefill_attention import num_prefill_kv_splits
from kvserve.kernels.rotary_store_kv import fusable
from kvserve.kernels.word_gemv import (
    GemvConfig,
    fp8_gemv_config,
    gemv_candidates,
    gemv_config,
)
from kvserve.layers.linear import Linear
from kvserve.models.decoder import DecoderForCausalLM


@pytest.mark.parametrize(
    ("programs", "max_seq_len", "tokens", "expected"),
    [
        (256, 131072, 2048, 1),  # a 2048-token chunk of an 8B model: 8 row blocks x 32 heads
        (128, 131072, 1024, 1),  # 128 programs already fill one wave
        (32, 131072, 256, 4),  # a 256-token chunk at 128K: one wave of 128 programs
        (64, 131072, 512, 2),
        (32, 4096, 256, 2),  # the same chunk at 4K: no split under 2048 keys
        (32, 1024, 256, 1),
        (1, 131072, 16, 16),  # capped
        (64, 131072, 4096, 1),  # 4096 rows x 32 heads x 129 x 4 B x 2 splits > 64 MiB
    ],
)
def test_prefill_split_count_from_shapes(
    programs: int, max_seq_len: int, tokens: int, expected: int
) -> None:
    assert num_prefill_kv_splits(programs, max_seq_len, tokens, 32, 128, 132) == expected


@pytest.mark.parametrize("heads", [8, 32, 64])
def test_warm_up_compiles_the_split_prefill_where_a_request_could_reach_it(heads: int) -> None:
    """A request's first short chunk behind a long prefix must not pay the split kernels'
    compile: the warm-up runs one such chunk whenever the context allows a split at all."""
    assert step_shapes(4095, 16) == STEPS
    *_, (decodes, rows, width, prefix) = step_shapes(131072, 16)
    assert decodes == 0 and width * 16 >= prefix + rows
    programs = -(-rows // 256) * heads  # one row block per head with the default tile
    assert num_prefill_kv_splits(programs, prefix + rows, rows, heads, 128, 132) > 1


# (cache, kv heads a rank, SMs, page size, table pages, most decode rows): Llama-3-8B on an H200
# at 128K with page 16, an FP8 cache, MQA, a TP rank's two heads, big pages, another GPU
DECODE_WARM_UP_CASES = [
    ("bf16", 8, 132, 16, 8192, 256),
    ("fp8", 8, 132, 16, 8192, 256),
    ("bf16", 1, 132, 16, 300, 300),
    ("fp8", 2, 132, 1, 5000, 70),
    ("bf16", 4, 78, 128, 64, 512),
]


@pytest.mark.parametrize("case", DECODE_WARM_UP_CASES, ids=str)
def test_warm_up_runs_every_decode_attention_launch_a_step_can_make(case: tuple) -> None:
    """Decode attention compiles a kernel per variant (split count, balanced cut, batch block);
    every number of decode rows up to the scheduler's most, over every page-table width, must
    launch one that the warm-up ran, or a request pays the compile."""
    cache, heads, sms, page, max_pages, max_decodes = case
    cfg = FP8_DECODE_CONFIG if cache == "fp8" else DecodeConfig()
    steps = decode_steps(cfg, heads, sms, page, max_pages, max_decodes, list(STEPS))
    assert all(prefill == 0 and 1 <= width <= max_pages for _, prefill, width, _ in steps)

    def variant(decodes: int, width: int) -> tuple:
        return launch_variant(cfg, decodes, heads, width * page, sms)

    warmed = {variant(d, w) for d, _, w, _ in [*STEPS, *steps] if d}
    assert len(warmed) == len(steps) + len({variant(d, w) for d, _, w, _ in STEPS if d})
    split_widths = min(max_pages, SPLIT_COUNT_TABLE_TOKENS // page + 1)
    widths = [*range(1, split_widths + 1), *range(split_widths, max_pages + 1, 97), max_pages]
    missed = {
        (d, w) for d in range(1, max_decodes + 1) for w in widths if variant(d, w) not in warmed
    }
    assert missed == set()


def test_a_full_batch_is_cut_by_its_tokens_only_where_its_tables_outgrow_a_split() -> None:
    """One split a sequence from occupancy: a second split column, the mean floor, the fused
    merge. One split from tables of one 64-token split: nothing to balance, the output direct."""
    cfg = DecodeConfig()
    full = launch_variant(cfg, 128, 8, 8192 * 16, 132)
    assert full[:2] == (False, True) and ("MEAN_FLOOR", True) in full[2]
    short = launch_variant(cfg, 128, 8, 64, 132)
    assert short[0] and ("BALANCED", False) in short[2] and ("BLOCK_B", 32) in short[2]
    assert launch_variant(cfg, 3, 8, 64, 132) == launch_variant(cfg, 300, 8, 64, 132)


@pytest.mark.parametrize("cfg", [DecodeConfig(), FP8_DECODE_CONFIG, DecodeConfig(num_splits=5)])
@pytest.mark.parametrize(("heads", "sms"), [(8, 132), (1, 132), (4, 78), (2, 16)])
def test_a_balanced_grid_holds_every_split_its_cut_can_make(
    cfg: DecodeConfig, heads: int, sms: int
) -> None:
    """balanced_splits makes at most ``budget`` splits a kv head, which the grid's B * S
    programs must hold, or a split would never run and its merge would read what no program
    wrote."""
    for batch in range(2, 300):
        for table_tokens in (64, 65, 1024, 4096, 131072):
            plan = _split_plan(cfg, batch, heads, table_tokens, sms)
            if plan.balanced:
                assert plan.splits >= 2 and batch <= plan.budget <= batch * plan.splits


@pytest.mark.parametrize(("group", "cap"), [(NVFP4_GROUP, 0), (MXFP4_GROUP, 128), (0, 0)])
def test_only_mxfp4_caps_its_registers_and_the_candidates_flip_the_fp4_options(
    group: int, cap: int
) -> None:
    default = gemv_config(6144, 512, scale_group=group)
    assert default.maxnreg == cap and not default.asm_scale_loads
    # the cap is a one-row choice: 2-4 rows' accumulators spill under it (tests/sm90_builds)
    assert all(gemv_config(6144, 512, rows=r, scale_group=group).maxnreg == 0 for r in (2, 4))
    candidates = gemv_candidates(6144, 512, scale_group=group)
    assert candidates[0] == default
    flipped = {(c.asm_scale_loads, c.maxnreg) for c in candidates[1:4]}
    other = 0 if cap else 128
    if group:  # FP8 has no block scales to load
        assert flipped == {(True, cap), (False, other), (True, other)}
    assert not any(c.asm_scale_loads for c in candidates[4 if group else 0 :])


@pytest.mark.parametrize("group", [NVFP4_GROUP, MXFP4_GROUP])
def test_fp4_default_config_passes_the_format_to_the_gemv(group: int) -> None:
    one_row = default_config(1, 6144, 4096, group=group)
    assert isinstance(one_row, GemvConfig)
    assert one_row.maxnreg == (128 if group == MXFP4_GROUP else 0)
    assert isinstance(default_config(64, 6144, 4096, group=group), Fp4GemmConfig)


@pytest.mark.parametrize(
    ("n", "k", "tile"),
    [(4096, 4096, (16, 256, 1)), (6144, 4096, (16, 256, 1)), (4096, 14336, (16, 256, 2)),
     (28672, 4096, (64, 64, 1))],
)  # fmt: skip
def test_fp4_one_row_takes_narrow_tiles_wide_in_k(n: int, k: int, tile: tuple) -> None:
    """One row of x: 16 rows by 256 words a program where 16-row tiles fit four an SM
    (Llama-3-8B's o needs no K split), 64 by 64 past that; the experts' GEMV of a decode step
    (``slots``) keeps the shared default, not measured there."""
    cfg = default_config(1, n, k)
    assert (cfg.block_n, cfg.block_w, cfg.split_k) == tile
    assert gemv_config(n, k // 8, slots=8, scale_group=NVFP4_GROUP).block_n == 128


@pytest.mark.parametrize(
    ("n", "k", "tile"),
    [
        (4096, 4096, (128, 32, 16)), (4096, 14336, (128, 32, 16)), (4096, 12288, (128, 32, 16)),
        (6144, 4096, (64, 64, 4)), (14336, 4096, (64, 64, 2)), (28672, 4096, (64, 64, 1)),
    ],
)  # fmt: skip
def test_fp8_gemv_one_row_tiles(n: int, k: int, tile: tuple) -> None:
    """One row: half sums; N = 4096 on 128-row by 32-word tiles split up to sixteen ways (with
    half sums faster than 64 x 64 split four ways, which fp32 sums preferred); wider N on 64 x 64
    tiles split at most four ways. Three or four rows keep fp32 sums."""
    cfg = fp8_gemv_config(n, k // 4, 1, 132)
    assert (cfg.block_n, cfg.block_w, cfg.split_k) == tile and cfg.half_sums
    assert not fp8_gemv_config(n, k // 4, 3, 132).half_sums


@pytest.mark.parametrize("m", [DEQUANT_GEMM_MIN_ROWS, 8192])
def test_fp4_steps_of_many_rows_dequantize_then_run_cublas(m: int) -> None:
    assert default_config(m, 28672, 4096) == DequantGemmConfig()
    below = default_config(DEQUANT_GEMM_MIN_ROWS - 1, 28672, 4096)
    assert isinstance(below, Fp4GemmConfig)
    # the kernel benchmark times the MMA kernel's default beside it
    assert below.block_m == 128 and below in candidate_configs(m, 28672, 4096)


@pytest.mark.parametrize(
    ("m", "n", "k", "split_k", "num_warps"),
    [
        (16, 4096, 14336, 4, 4),  # 64 tiles: 4 splits give 256 programs, >= 1.9 per SM
        (64, 6144, 4096, 4, 4),  # 96 tiles, 3 stages: 4 splits (384) fill 3 an SM in one wave
        (64, 4096, 4096, 6, 4),  # 64 tiles: 6 splits (384); 8 would overflow 3 an SM
        (64, 28672, 4096, 1, 8),  # 224 tiles of 128 W rows fill the SMs unsplit, at 8 warps
        (256, 4096, 4096, 2, 4),  # 128-row tiles, one program an SM: 1.2 per SM wanted
        (256, 6144, 4096, 1, 8),  # 192 tiles are enough; unsplit 128-row tiles take 8 warps
        (64, 64, 512, 2, 4),  # K of 4 steps allows 2 splits at most (2 steps each)
    ],
)
def test_fp4_mma_default_splits_k_to_the_programs_an_sm_wants(
    m: int, n: int, k: int, split_k: int, num_warps: int
) -> None:
    cfg = mma_config(m, n, k, num_sms=132)
    assert isinstance(cfg, Fp4GemmConfig) and cfg.word_dequant
    assert (cfg.split_k, cfg.num_warps) == (split_k, num_warps)
    # 128 W rows only at 64 rows of x and where their tiles alone fill the SMs
    assert cfg.block_n == (128 if cfg.block_m == 64 and n >= 128 * 132 else 64)


def test_fp4_moe_decode_takes_the_gemv_unless_switched_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fused_moe_fp4.moe_gemv_enabled.cache_clear()
    try:
        monkeypatch.delenv(fused_moe_fp4.MOE_GEMV_ENV, raising=False)
        assert fused_moe_fp4.moe_gemv_enabled()
        monkeypatch.setenv(fused_moe_fp4.MOE_GEMV_ENV, "0")
        fused_moe_fp4.moe_gemv_enabled.cache_clear()
        assert not fused_moe_fp4.moe_gemv_enabled()
    finally:
        fused_moe_fp4.moe_gemv_enabled.cache_clear()


@pytest.mark.parametrize(
    ("rotary_dim", "head_dim", "fused"),
    [(128, 128, True), (64, 128, True), (64, 64, True), (96, 128, False), (80, 80, False)],
)
def test_the_fused_rotary_store_takes_power_of_two_halves_and_tails(
    rotary_dim: int, head_dim: int, fused: bool
) -> None:
    """Llama / Qwen3 (full rotary), GLM-4.5 (half): fused; other shapes keep the unfused path."""
    assert fusable(rotary_dim, head_dim) is fused


@pytest.mark.parametrize("pdl", [False, True])
def test_every_linear_layer_takes_pdl_from_the_kernel_options(pdl: bool) -> None:
    cfg = ModelConfig(
        architecture="LlamaForCausalLM", vocab_size=64, hidden_size=32, intermediate_size=64,
        num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
    )  # fmt: skip
    model = DecoderForCausalLM(cfg, torch.float32, max_positions=64,
                               kernels=KernelOptions(triton=True, pdl=pdl))  # fmt: skip
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert len(linears) == 4 * cfg.num_layers
    assert all(layer.launch_pdl is pdl for layer in linears)


@pytest.mark.parametrize(
    ("m", "w_as_b"), [(2, True), (16, True), (20, False), (32, False), (64, False), (128, False)]
)
def test_fp4_mma_reads_w_as_the_b_operand_up_to_16_rows(m: int, w_as_b: bool) -> None:
    cfg = default_config(m, 6144, 4096, num_sms=132)
    assert isinstance(cfg, Fp4GemmConfig) and cfg.w_as_b == w_as_b
    with pytest.raises(ValueError, match="at most 32 rows"):
        Fp4GemmConfig(64, 128, 64, w_as_b=True)


def test_fp4_candidates_at_64_rows_try_each_stage_count_at_one_wave_of_its_programs() -> None:
    from kvserve.kernels.fp4_gemm import HOLDS_AT_64_ROWS_BY_STAGES, candidate_configs

    default, *others = candidate_configs(64, 6144, 4096, num_sms=132)
    assert (default.num_stages, default.split_k) == (3, 4)  # 384 programs, 3 an SM hold
    for stages, holds in HOLDS_AT_64_ROWS_BY_STAGES.items():
        cfg = next(c for c in [default, *others] if c.num_stages == stages and c.block_n == 64)
        programs = 96 * cfg.split_k  # 6144 / 64 W rows
        assert programs <= holds * 132 < programs + 96 * cfg.split_k  # one wave, more than half


@pytest.mark.parametrize(("n", "k"), [(6144, 4096), (4096, 14336), (28672, 4096), (4096, 4096)])
@pytest.mark.parametrize("m", [1, 16, 64, 256, 1024])
def test_candidate_configs_are_valid(m: int, n: int, k: int) -> None:
    configs = candidate_configs(m, n, k, num_sms=132)
    assert configs[0] == default_config(m, n, k, num_sms=132)
    assert len(set(configs)) == len(configs) >= 4
    assert (DequantGemmConfig() in configs) == (m > 128)
    for cfg in configs:
        if isinstance(cfg, GemvConfig):
            assert m <= 4 and (cfg.split_k == 1 or -(-n // cfg.block_n) * cfg.split_k <= 8 * 132)
            continue
        if isinstance(cfg, DequantGemmConfig):
            continue
        # above 128 rows the candidates also take x in one 256-row tile
        assert cfg.block_m in (block_m_for(m), 256 if m > 128 else 0) and cfg.block_k % 32 == 0
        assert not cfg.w_as_b or cfg.block_m <= 32
        programs = -(-m // cfg.block_m) * -(-n // cfg.block_n) * cfg.split_k
        assert cfg.split_k == 1 or programs <= 4 * 132


@pytest.mark.parametrize(
    ("m", "n", "k", "split"),
    [(64, 28672, 4096, 1), (64, 6144, 4096, 2), (64, 4096, 14336, 4), (32, 4096, 4096, 4),
     (64, 4096, 512, 1)],
)  # fmt: skip
def test_fp4_async_gemm_splits_k_until_its_programs_fill_most_sms(
    m: int, n: int, k: int, split: int
) -> None:
    """One 128-row W tile a program, one program an SM, 70% of the SMs filled (qkv's 48 tiles
    split in 2, not 4: s74's H100 sweep); a split keeps four K steps or more."""
    from kvserve.kernels.fp4_async_choice import async_config

    assert async_config(m, n, k, num_sms=132).split_k == split


@pytest.mark.parametrize(
    ("m", "n", "k", "split", "max_registers"),
    [(64, 28672, 4096, 1, 128), (32, 28672, 4096, 1, 128), (128, 28672, 4096, 1, None),
     (64, 16384, 4096, 1, None), (64, 6144, 4096, 2, None)],
)  # fmt: skip
def test_fp4_async_gemm_runs_two_programs_an_sm_where_its_tiles_fill_twice_the_sms(
    m: int, n: int, k: int, split: int, max_registers: int | None
) -> None:
    """Capped registers (two programs an SM) only for tiles that fill 70% of twice the SMs with
    K unsplit (gate_up's 224 at 132 SMs, not 128) and x tiles up to 64 rows (a 128-row tile
    would spill under the cap)."""
    from kvserve.kernels.fp4_async_choice import async_config

    cfg = async_config(m, n, k, num_sms=132)
    assert (cfg.split_k, cfg.max_registers, cfg.bits) == (split, max_registers, True)


@pytest.mark.parametrize(
    ("mode", "n", "num_sms", "takes"),
    [("auto", 28672, 132, True), ("auto", 6144, 132, False), ("auto", 12288, 132, True),
     ("auto", 11776, 132, False), ("auto", 6144, 60, True), ("1", 6144, 132, True),
     ("0", 28672, 132, False)],
)  # fmt: skip
def test_fp4_async_auto_takes_gemms_whose_tiles_fill_the_sms_unsplit(
    mode: str, n: int, num_sms: int, takes: bool
) -> None:
    """``KVSERVE_FP4_ASYNC=auto``: 128-row W tiles at least 70% of the SMs (92.4 of 132: 96
    tiles of N 12288 yes, 92 of 11776 no), at any rows of the range (K 512: no split of 16
    steps); ``1`` takes every one."""
    from kvserve.kernels.fp4_async_choice import mode_takes_shape

    for m in (17, 64, 128):
        assert mode_takes_shape(mode, m, n, 512, num_sms) is takes


@pytest.mark.parametrize(
    ("m", "n", "k", "takes"),
    [(128, 4096, 14336, True), (96, 6144, 4096, True), (128, 4096, 4096, False),
     (64, 4096, 14336, True), (33, 4096, 14336, True), (64, 6144, 4096, False),
     (32, 4096, 14336, False), (17, 6144, 4096, False)],
)  # fmt: skip
def test_fp4_async_auto_takes_long_splits(m: int, n: int, k: int, takes: bool) -> None:
    """``auto`` also takes a GEMM whose split keeps 16 K steps or more at 65-128 rows (one
    128-row x tile: Llama-3-8B's down, 28, and qkv, 16; not o, 8), 24 or more at 33-64 rows
    (down, not qkv), and none at 32 rows or fewer."""
    from kvserve.kernels.fp4_async_choice import mode_takes_shape

    assert mode_takes_shape("auto", m, n, k, 132) is takes


@pytest.mark.parametrize(
    ("m", "n", "k", "group", "takes"),
    [(32, 6144, 4096, 16, True), (17, 4096, 14336, 16, True), (32, 4096, 4096, 16, False),
     (64, 6144, 4096, 16, False), (64, 4096, 14336, 16, True), (128, 6144, 4096, 16, True),
     (32, 6144, 4096, 32, True), (32, 4096, 4096, 32, False), (64, 6144, 4096, 32, True),
     (33, 6144, 4096, 32, True), (64, 4096, 4096, 32, False)],
)  # fmt: skip
def test_fp4_async_auto_takes_shorter_splits_of_x_its_producer_permuted(
    m: int, n: int, k: int, group: int, takes: bool
) -> None:
    """With x written in the step order by its producer, ``auto`` also takes 17-32-row steps
    whose split keeps 16 K steps (Llama-3-8B's qkv and down; not o's 8), as the plain rule does
    not; in MXFP4 (32-value groups) 33-64-row steps so too (qkv); NVFP4 keeps the plain rule's
    24 there."""
    from kvserve.kernels.fp4_async_choice import mode_takes_shape

    assert mode_takes_shape("auto", m, n, k, 132, from_producer_group=group) is takes
    if m <= 32 or (group == 32 and m <= 64 and n == 6144):
        assert not mode_takes_shape("auto", m, n, k, 132)


def test_fp4_async_mode_refuses_other_values(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvserve.errors import ConfigError
    from kvserve.kernels import fp4_async_choice

    for value, mode in (("auto", "auto"), ("1", "1"), ("0", "0")):
        monkeypatch.setenv(fp4_async_choice.ASYNC_ENV, value)
        fp4_async_choice.async_gemm_mode.cache_clear()
        assert fp4_async_choice.async_gemm_mode() == mode
    monkeypatch.setenv(fp4_async_choice.ASYNC_ENV, "on")
    fp4_async_choice.async_gemm_mode.cache_clear()
    with pytest.raises(ConfigError, match="KVSERVE_FP4_ASYNC='on'"):
        fp4_async_choice.async_gemm_mode()
    fp4_async_choice.async_gemm_mode.cache_clear()


@pytest.mark.parametrize(("bits", "largest"), [(False, 136), (True, 128)])
def test_fp4_async_gemm_takes_mxfp4_scales_up_to_its_decodes_largest(
    bits: bool, largest: int
) -> None:
    """E8M0 exponent 136 = 2**9 is the e4m3 trick's largest, 128 = 2**1 bit placement's (its
    scale takes 2**8 more, so exponent 0 stays exact); NVFP4's scales always fit. K must be a
    multiple of 128 and W's rows word-aligned (checked once, at load)."""
    from kvserve.kernels.fp4_async_choice import weight_fits

    packed = torch.zeros(4, 128, dtype=torch.uint8)  # K = 256
    exponents = torch.zeros(4, 8, dtype=torch.uint8)
    assert weight_fits(packed, exponents, bits)
    exponents[2, 5] = largest
    assert weight_fits(packed, exponents, bits)
    exponents[3, 0] = largest + 1
    assert not weight_fits(packed, exponents, bits)
    assert weight_fits(packed, torch.full((4, 16), 448.0).to(torch.float8_e4m3fn), bits)
    nvfp4_k192 = torch.ones(4, 12).to(torch.float8_e4m3fn)
    assert not weight_fits(torch.zeros(4, 96, dtype=torch.uint8), nvfp4_k192, bits)
    unaligned = torch.zeros(4, 130, dtype=torch.uint8)[:, 1:129]
    assert not weight_fits(unaligned, torch.full((4, 8), 127, dtype=torch.uint8), bits)


def test_fp4_async_decode_moves_every_code_pair_from_f16_to_bf16_exactly() -> None:
    """The async GEMM's decode PTX (``fp4_async_decode._FP4_WORD_TO_BF16``) run on the host with its
    own shift, select mask and lop3 table: each E2M1 code as the e4m3 trick's f16 (value * 2**-6),
    a pair of them shifted down and the sign bits selected back reads as bf16
    value * 2**-CODE_UNIT_LOG2, for all 256 pairs (the pair's bits never cross, and the shifted
    sign lands on a bit that is 0 for these values)."""
    import re

    from kvserve.kernels import fp4_async_decode
    from kvserve.kernels.fp4_reference import E2M1_VALUES

    ptx = fp4_async_decode._FP4_WORD_TO_BF16
    ptx = str(getattr(ptx, "value", ptx))
    shift, mask, table = re.search(
        r"shr\.b32 t0, w0, (\d+); lop3\.b32 w0, t0, w0, (0x[0-9A-Fa-f]+), (0x[0-9A-Fa-f]+);", ptx
    ).groups()
    shift, mask, table = int(shift), int(mask, 16), int(table, 16)
    codes = torch.arange(16, dtype=torch.int32)
    e4m3 = ((codes & 7) << 2) | ((codes >> 3) << 7)
    f16 = e4m3.to(torch.uint8).view(torch.float8_e4m3fn).to(torch.float16)
    bits = f16.view(torch.int16).to(torch.int64) & 0xFFFF
    pair = bits[:, None] | (bits[None, :] << 16)  # [low code, high code]
    a, b = pair >> shift, pair
    moved = torch.zeros_like(pair)
    for bit in range(32):  # lop3: table bit (a << 2 | b << 1 | c) of each bit triple
        ab = ((a >> bit) & 1) * 4 + ((b >> bit) & 1) * 2 + ((mask >> bit) & 1)
        moved |= ((table >> ab) & 1) << bit

    def as_bf16(half: torch.Tensor) -> torch.Tensor:
        signed = ((half & 0xFFFF) ^ 0x8000) - 0x8000
        return signed.to(torch.int16).view(torch.bfloat16).float()

    want = torch.tensor(E2M1_VALUES) * 2.0**-fp4_async_decode.CODE_UNIT_LOG2
    assert torch.equal(as_bf16(moved), want[:, None].expand(16, 16))
    assert torch.equal(as_bf16(moved >> 16), want[None, :].expand(16, 16))


@pytest.mark.parametrize("bits", [False, True])
def test_fp4_async_gemm_takes_x_in_the_permutation_its_w_decode_makes(bits: bool) -> None:
    """``permute_x_steps`` puts natural column k = 32 q + 8 kbhi + 4 kblo + 2 h + e of each
    128-column step at column p = 32 kbhi + 16 kblo + 8 h + 2 q + e, where the W decode puts the
    code of k (word 4 q + kbhi, nibble 4 kblo + 2 h + e; ``fp4_async_decode``): so the kernel's
    sum over p is x @ W.T. The bit-placing decode pairs a word's codes j and j + 4: nibble
    4 e + 2 kblo + h."""
    from kvserve.kernels.fp4_step_order import permute_x_steps

    m, steps = 3, 2
    x = torch.arange(m * steps * 128, dtype=torch.float32).reshape(m, steps * 128)
    got = permute_x_steps(x, bits)
    assert got.is_contiguous() and got.shape == x.shape
    for q, kbhi, kblo, h, e in itertools.product(range(4), range(4), range(2), range(2), range(2)):
        word = 4 * q + kbhi
        nibble = 4 * e + 2 * kblo + h if bits else 4 * kblo + 2 * h + e
        k, p = 8 * word + nibble, 32 * kbhi + 16 * kblo + 8 * h + 2 * q + e
        for step in range(steps):
            assert torch.equal(got[:, step * 128 + p], x[:, step * 128 + k])


_PTX_B32_OPS = {
    "shl": lambda a, b: (a << b) & 0xFFFFFFFF, "shr": lambda a, b: a >> b,
    "and": lambda a, b: a & b, "or": lambda a, b: a | b,
}  # fmt: skip


def _run_ptx_bits(ptx: str, word: torch.Tensor) -> list[torch.Tensor]:
    """The bit-placing decode's PTX (shl / shr / and / or on b32, ``mov.b32 {lo, hi}``) run on
    the host over int64 words; its eight 16-bit outputs $0..$7."""
    import re

    regs: dict[str, torch.Tensor] = {"$8": word}
    out: dict[str, torch.Tensor] = {}

    def value(token: str) -> torch.Tensor | int:
        return regs[token] if token in regs else int(token, 0)

    for op, args in re.findall(r"(shl|shr|and|or|mov)\.b32\s+([^;]+);", ptx):
        if op == "mov":
            lo, hi, src = re.fullmatch(r"\{(\$\d), (\$\d)\}, (\w+)", args.strip()).groups()
            out[lo], out[hi] = regs[src] & 0xFFFF, (regs[src] >> 16) & 0xFFFF
            continue
        dst, a, b = (t.strip() for t in args.split(","))
        regs[dst] = _PTX_B32_OPS[op](value(a), value(b))
    return [out[f"${i}"] for i in range(8)]


def test_fp4_async_bit_decode_reads_each_code_as_bf16_value_times_two_to_minus_126() -> None:
    """``_FP4_WORD_TO_BF16_BITS`` run on the host: output i of a word is its nibble i's E2M1
    value * 2**-126 as bf16 (0.5 a subnormal), for every code at every nibble, beside random
    neighbours; so with the scales' 2**118 the products are value * 2**-8, undone after the
    K loop (``BITS_SUM_SCALE``)."""
    from kvserve.kernels import fp4_async_decode
    from kvserve.kernels.fp4_reference import E2M1_VALUES

    ptx = fp4_async_decode._FP4_WORD_TO_BF16_BITS
    ptx = str(getattr(ptx, "value", ptx))
    gen = torch.Generator().manual_seed(0)
    words = torch.randint(0, 2**32, (4096,), generator=gen, dtype=torch.int64)
    words[:128] = torch.arange(16).repeat(8) << (4 * torch.arange(8).repeat_interleave(16))
    halves = _run_ptx_bits(ptx, words)
    values = torch.tensor(E2M1_VALUES, dtype=torch.float64)
    unit = 2.0 ** -(fp4_async_decode.CODE_UNIT_LOG2 + 8)
    assert fp4_async_decode.BITS_SUM_SCALE == 2.0**8
    for i, half in enumerate(halves):
        signed = (half ^ 0x8000) - 0x8000
        got = signed.to(torch.int16).view(torch.bfloat16).double()
        assert torch.equal(got, values[(words >> (4 * i)) & 15] * unit), i
