"""The quantization seam: the registry resolves configs and flags, refuses what it cannot run
by name, and a linear layer routes every checkpoint tensor to its method by name and shard."""

from __future__ import annotations

import pytest
import torch

from kvserve.errors import ConfigError, ModelLoadError
from kvserve.layers.linear import Linear
from kvserve.quant.registry import QuantConfig, UnsupportedQuantization, linear_method, resolve


def test_unquantized_checkpoint_without_flag_is_none() -> None:
    assert resolve(None).scheme == "none"
    assert resolve(None, "auto").scheme == "none"


@pytest.mark.parametrize(
    ("qc", "named"),
    [
        ({"quant_method": "awq", "bits": 4}, "quant_method awq"),
        ({"quant_method": "compressed-tensors", "format": "int-quantized"}, "int-quantized"),
        ({"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}, "W4A8_AWQ"),
    ],
)
def test_unknown_scheme_is_refused_naming_it_and_what_runs(qc: dict, named: str) -> None:
    with pytest.raises(UnsupportedQuantization) as info:
        resolve(qc)
    assert named in str(info.value) and "kvserve runs:" in str(info.value)


def test_unknown_flag_is_refused_when_the_engine_config_is_built() -> None:
    from kvserve.engine.config_builder import build_engine_config

    with pytest.raises(ConfigError, match="--quantization int3 is not supported"):
        build_engine_config(None, quantization="int3")


def test_ignored_layers_get_the_unquantized_method() -> None:
    config = QuantConfig("none", "none", "test", ignore=("re:.*lm_head", "model.layers.0.*"))
    method = linear_method(config, ["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"])
    assert type(method).__name__ == "UnquantizedLinearMethod"
    with pytest.raises(UnsupportedQuantization, match="only some of them"):
        linear_method(config, ["model.layers.0.mlp.gate_proj", "model.layers.1.mlp.up_proj"])


def test_shards_land_in_their_rows_and_foreign_tensors_are_refused() -> None:
    layer = Linear(4, [2, 3, 3], True, torch.float32, prefix="l.qkv_proj")
    assert layer.missing() == [f"l.qkv_proj.{n}[{s}]" for n in ("weight", "bias") for s in range(3)]
    for shard, rows in enumerate([2, 3, 3]):
        layer.load_shard("weight", torch.full((rows, 4), float(shard)), shard)
        layer.load_shard("bias", torch.full((rows,), float(shard)), shard)
    assert layer.missing() == []
    assert layer.weight[:, 0].tolist() == [0, 0, 1, 1, 1, 2, 2, 2]
    assert layer.bias.tolist() == [0, 0, 1, 1, 1, 2, 2, 2]
    with pytest.raises(ModelLoadError, match="'weight_scale' has no place"):
        layer.load_shard("weight_scale", torch.ones(1), 1)
    with pytest.raises(ModelLoadError, match="checkpoint shape"):
        layer.load_shard("weight", torch.ones(3, 4), 0)


def test_bf16_gemv_rows_default_to_small_weights_at_one_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``KVSERVE_BF16_GEMV_ROWS`` unset: one-token steps of weights of at most
    ``GEMV_SMALL_WEIGHT`` values take the GEMV (Qwen3-30B-A3B's attention), larger ones
    (Llama-3-8B's) stay on cuBLAS; set, it applies to every weight; a bad value is refused."""
    from kvserve.env_settings import check_environment
    from kvserve.quant import unquantized

    monkeypatch.delenv(unquantized.GEMV_ROWS_ENV, raising=False)
    unquantized.gemv_max_rows.cache_clear()
    try:
        assert unquantized.gemv_rows_for(5120 * 2048) == 1  # Qwen3-30B-A3B q/k/v
        assert unquantized.gemv_rows_for(4096 * 4096) == 0  # Llama-3-8B o
        monkeypatch.setenv(unquantized.GEMV_ROWS_ENV, "2")
        unquantized.gemv_max_rows.cache_clear()
        assert unquantized.gemv_rows_for(4096 * 28672) == 2
        monkeypatch.setenv(unquantized.GEMV_ROWS_ENV, "0")
        unquantized.gemv_max_rows.cache_clear()
        assert unquantized.gemv_rows_for(16) == 0
        monkeypatch.setenv(unquantized.GEMV_ROWS_ENV, "x")
        unquantized.gemv_max_rows.cache_clear()
        with pytest.raises(ConfigError, match="KVSERVE_BF16_GEMV_ROWS='x'"):
            check_environment()  # what an engine runs first
    finally:
        monkeypatch.delenv(unquantized.GEMV_ROWS_ENV, raising=False)
        unquantized.gemv_max_rows.cache_clear()
