"""The tuned-tile tables of the experts' grouped GEMMs: the shipped tables are well formed and
match the tuner's shape keys, a step takes the nearest tuned token count, and a table that is
missing, switched off or malformed is handled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks.moe_tune_space import (
    Step,
    candidate_tiles,
    gemv_tiles,
    on_gemv,
    shape_key,
    shape_of,
    step_candidates,
)
from kvserve.kernels import moe_tiles
from kvserve.kernels.fused_moe_fp8 import FP8_MOE_GEMV_ENV, fp8_moe_gemv_enabled
from kvserve.kernels.fused_moe_half_gemv import HALF_MOE_GEMV_ENV, half_moe_gemv_enabled
from kvserve.kernels.moe_tiles import GEMV_KEYS, MoeShape, MoeTiles, load_table, tuned_tiles
from kvserve.kernels.word_gemv import GemvConfig

SHAPE = MoeShape("bfloat16", 8, 256, 128, 2)


def _tile(m: int, n: int) -> dict[str, int]:
    return {"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3}


def _write(directory: Path, shapes: dict) -> None:
    (directory / "Test_GPU.json").write_text(json.dumps({"device": "Test GPU", "shapes": shapes}))


def test_shipped_tables_are_well_formed() -> None:
    tables = sorted(moe_tiles.TABLE_DIR.glob("*.json"))
    assert tables, "no tuned MoE tile table in the package"
    for path in tables:
        data = json.loads(path.read_text())
        assert moe_tiles.table_path(data["device"]) == path
        runs = data["produced_by"]
        assert runs and all(r["command"].startswith("python -m benchmarks.moe_tune") for r in runs)
        table = load_table(data["device"])
        assert table and all(entries for entries in table.values())
        for key in table:
            kind, *fields = key.split()
            assert kind.removesuffix("_gemv") in (
                "bfloat16", "float16", "fp8_block128x128", "fp8_channel", "nvfp4", "mxfp4"
            ), key  # fmt: skip
            assert [f.split("=")[0] for f in fields] == ["E", "N", "K", "top_k"], key


def test_tuner_keys_are_what_the_kernels_look_up() -> None:
    """qwen3-30b-a3b's experts: 128 of 2 x 768 x 2048, top 8; TP 2 halves the intermediate;
    the FP8 kinds are ``fused_moe_fp8.fp8_kind``'s."""
    assert shape_key("bf16", shape_of("qwen3-30b-a3b", 1)).key() == (
        "bfloat16 E=128 N=1536 K=2048 top_k=8"
    )
    assert shape_key("fp8", shape_of("qwen3-30b-a3b", 2)).key() == (
        "fp8_block128x128 E=128 N=768 K=2048 top_k=8"
    )
    assert shape_key("fp8-channel", shape_of("glm-4.5-air", 1)).kind == "fp8_channel"


@pytest.mark.parametrize(
    ("fmt", "env", "cached", "per_word", "kind"),
    [
        ("fp8", FP8_MOE_GEMV_ENV, fp8_moe_gemv_enabled, 4, "fp8_block128x128_gemv"),
        ("bf16", HALF_MOE_GEMV_ENV, half_moe_gemv_enabled, 2, "bfloat16_gemv"),
    ],
    ids=["fp8", "bf16"],
)
def test_decode_steps_tune_gemv_tiles_when_the_gemv_is_on(  # noqa: ANN201
    fmt: str, env: str, cached, per_word: int, kind: str, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
):  # fmt: skip
    """With ``KVSERVE_FP8_MOE_GEMV=1`` (``KVSERVE_BF16_MOE_GEMV=1``) a one-token GLM-4.5-Air FP8
    (bf16) step is tuned as the engine runs it, on the word GEMV: GEMV tiles (K in words of
    four e4m3 or two bf16 values) under the ``*_gemv`` key the kernels look up; with the switch
    at 0, the grouped kernel's tiles."""
    shape = shape_of("glm-4.5-air", 1)
    step = Step("glm-4.5-air", fmt, 1)
    slots, experts = 9, 129  # the shared expert stacked (moe_gemm.stacked)
    try:
        monkeypatch.setenv(env, "1")
        cached.cache_clear()
        assert on_gemv(fmt, slots, experts) and not on_gemv(fmt, 64 * slots, experts)
        (gate_up, down), = step_candidates(step, shape, 132).values()  # fmt: skip
        assert all(set(t) == set(GEMV_KEYS) for t in gate_up + down)
        assert gate_up == gemv_tiles(2816, 4096 // per_word, slots, 132)
        assert down == gemv_tiles(4096, 1408 // per_word, slots, 132)
        assert shape_key(fmt, shape, True).key() == f"{kind} E=128 N=2816 K=4096 top_k=8"
        monkeypatch.setenv(env, "0")
        cached.cache_clear()
        assert not on_gemv(fmt, slots, experts)
        tiles = step_candidates(step, shape, 132).values()
        assert all("BLOCK_M" in t for ts in tiles for t in ts[0])
    finally:
        monkeypatch.delenv(env)
        cached.cache_clear()


def test_candidates_fit_shared_memory_and_fp8_scale_blocks() -> None:
    for fmt in ("bf16", "fp8", "nvfp4"):
        for m in (16, 32, 64, 128):
            tiles = candidate_tiles(fmt, m)
            assert tiles and all(t["BLOCK_M"] == m for t in tiles)
            if fmt == "fp8":
                assert all(t["BLOCK_K"] == 128 and t["BLOCK_N"] <= 128 for t in tiles)


def test_nearest_tuned_token_count_in_log_scale(moe_table_dir: Path) -> None:
    entries = {str(t): {"gate_up": _tile(16, 32 * i), "down": _tile(16, 64)}
               for i, t in enumerate((1, 4, 64), start=1)}  # fmt: skip
    _write(moe_table_dir, {SHAPE.key(): entries})
    picked = {t: tuned_tiles(SHAPE, t, "Test GPU").gate_up["BLOCK_N"] for t in (1, 2, 3, 9, 40)}
    # 2 is as near 1 as 4 (the smaller wins); 9 is nearer 4 than 64 in log scale, 40 nearer 64
    assert picked == {1: 32, 2: 32, 3: 64, 9: 64, 40: 96}
    other = MoeShape("bfloat16", 8, 256, 128, 4)
    assert tuned_tiles(other, 1, "Test GPU") is None
    assert tuned_tiles(SHAPE, 1, "Other GPU") is None


def test_without_a_gpu_or_with_tables_off_the_fallback_runs(
    moe_table_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(moe_table_dir, {SHAPE.key(): {"1": {"gate_up": _tile(16, 32), "down": _tile(16, 64)}}})
    fallback = _tile(64, 128)
    got = moe_tiles.moe_tiles(SHAPE, 1, torch.device("cpu"), fallback)
    assert got == MoeTiles(fallback, fallback)
    monkeypatch.setenv(moe_tiles.TUNED_ENV, "0")
    moe_tiles.reload_tables()
    assert moe_tiles.moe_tiles(SHAPE, 1, torch.device("cuda", 0), fallback).block_m == 64


def test_a_config_dir_with_a_table_for_the_gpu_overrides_the_shipped_one(
    moe_table_dir: Path, tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    _write(moe_table_dir, {SHAPE.key(): {"1": {"gate_up": _tile(16, 32), "down": _tile(16, 64)}}})
    tuned_here = tmp_path_factory.mktemp("tuned_here")
    _write(tuned_here, {SHAPE.key(): {"1": {"gate_up": _tile(16, 128), "down": _tile(16, 64)}}})
    monkeypatch.setenv(moe_tiles.CONFIG_DIR_ENV, str(tuned_here))
    moe_tiles.reload_tables()
    assert tuned_tiles(SHAPE, 1, "Test GPU").gate_up["BLOCK_N"] == 128
    assert moe_tiles.active_table_path("Test GPU") == tuned_here / "Test_GPU.json"
    # a directory without this GPU's table leaves the shipped one in force
    monkeypatch.setenv(moe_tiles.CONFIG_DIR_ENV, str(tmp_path_factory.mktemp("empty")))
    moe_tiles.reload_tables()
    assert tuned_tiles(SHAPE, 1, "Test GPU").gate_up["BLOCK_N"] == 32
    # a mistyped directory is named in a warning, and the shipped table is read
    monkeypatch.setenv(moe_tiles.CONFIG_DIR_ENV, str(tuned_here / "no_such_dir"))
    moe_tiles.reload_tables()
    with caplog.at_level("WARNING", logger="kvserve.kernels"):
        assert tuned_tiles(SHAPE, 1, "Test GPU").gate_up["BLOCK_N"] == 32
    assert [r.getMessage() for r in caplog.records] == [
        f"MoE tiles: KVSERVE_MOE_CONFIG_DIR={tuned_here / 'no_such_dir'} is not a directory; "
        "the shipped table is read"
    ]


@pytest.mark.parametrize(
    "entry",
    [
        {"gate_up": _tile(16, 32)},  # no down tile
        {"gate_up": {}, "down": {}},  # only a GEMV tile may be empty
        {"gate_up": _tile(16, 32), "down": _tile(32, 64)},  # BLOCK_M differs
        {"gate_up": _tile(16, 32) | {"BLOCK_N": "32"}, "down": _tile(16, 64)},
        {"gate_up": _tile(16, 32) | {"num_ctas": 1}, "down": _tile(16, 64)},
    ],
)
def test_a_malformed_table_names_its_file(moe_table_dir: Path, entry: dict) -> None:
    _write(moe_table_dir, {SHAPE.key(): {"1": entry}})
    with pytest.raises(ValueError, match="Test_GPU.json: not a MoE tile table"):
        load_table("Test GPU")


def test_a_table_of_zero_tokens_is_refused(moe_table_dir: Path) -> None:
    well_formed = {"gate_up": _tile(16, 32), "down": _tile(16, 64)}
    _write(moe_table_dir, {SHAPE.key(): {"0": well_formed}})  # a step has at least one token
    with pytest.raises(ValueError, match="token counts are positive"):
        load_table("Test GPU")


def test_a_gpu_takes_its_table_and_names_an_untuned_shape_once(
    moe_table_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The GPU's name is the one thing a CPU cannot answer: it is given here."""
    monkeypatch.setattr(moe_tiles, "_device_name", lambda index: "Test GPU")
    tuned = {"gate_up": _tile(16, 32), "down": _tile(16, 64)}
    _write(moe_table_dir, {SHAPE.key(): {"1": tuned}})
    gpu, fallback = torch.device("cuda", 0), _tile(64, 128)
    assert moe_tiles.moe_tiles(SHAPE, 3, gpu, fallback) == MoeTiles(**tuned)
    other = MoeShape("nvfp4", 8, 256, 128, 2)
    moe_tiles._note_untuned.cache_clear()
    with caplog.at_level("WARNING", logger="kvserve.kernels"):
        for _ in range(3):
            assert moe_tiles.moe_tiles(other, 3, gpu, fallback) == MoeTiles(fallback, fallback)
    assert [r.getMessage() for r in caplog.records] == [
        "MoE tiles: no tuned entry for nvfp4 E=8 N=256 K=128 top_k=2 on Test GPU in "
        f"{moe_table_dir / 'Test_GPU.json'}; heuristic tiles (tune with python -m "
        "benchmarks.moe_tune)"
    ]


def test_gemv_kinds_take_gemv_configs_or_the_default(moe_table_dir: Path) -> None:
    """FP4 decode steps run the word GEMV: its GemvConfig fields, or {} for its own default."""
    gemv = {"block_n": 16, "block_w": 256, "split_k": 2, "num_warps": 4, "num_stages": 3}
    shape = MoeShape("nvfp4_gemv", 8, 256, 128, 2)
    _write(moe_table_dir, {shape.key(): {"1": {"gate_up": {}, "down": gemv}}})
    tiles = tuned_tiles(shape, 1, "Test GPU")
    assert (tiles.gate_up, tiles.down) == ({}, gemv)
    GemvConfig(**tiles.down)  # the fields the GEMV launch takes
    _write(moe_table_dir, {shape.key(): {"1": {"gate_up": _tile(16, 32), "down": gemv}}})
    moe_tiles.reload_tables()
    with pytest.raises(ValueError, match="not a MoE tile table"):
        load_table("Test GPU")


def test_fp8_decode_steps_take_the_gemv_for_both_scale_layouts_unless_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``KVSERVE_FP8_MOE_GEMV`` unset or 1: block-scaled and per-channel experts' decode steps
    on the GEMV; 0: both on the grouped kernel."""
    slots, experts = 9, 129
    try:
        for value, on in ((None, True), ("1", True), ("0", False)):
            if value is None:
                monkeypatch.delenv(FP8_MOE_GEMV_ENV, raising=False)
            else:
                monkeypatch.setenv(FP8_MOE_GEMV_ENV, value)
            fp8_moe_gemv_enabled.cache_clear()
            assert on_gemv("fp8", slots, experts) is on
            assert on_gemv("fp8-channel", slots, experts) is on
            assert not on_gemv("fp8-channel", 64 * slots, experts)
    finally:
        monkeypatch.delenv(FP8_MOE_GEMV_ENV, raising=False)
        fp8_moe_gemv_enabled.cache_clear()
