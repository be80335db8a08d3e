"""The L2 warm of a decoder layer's next weights (``kvserve.kernels.l2_warm``): which bytes a
layer's attention asks for, cut to the budget, and its setting. The kernel's requests are
checked where they can run: built for sm_90 (``tests/sm90_builds``) and on the GPU."""

from __future__ import annotations

import pytest
import torch

from kvserve.config import ModelConfig, MoEConfig
from kvserve.errors import ConfigError
from kvserve.kernels.l2_warm import (
    ROUTER_WARM_ENV,
    WARM_ENV,
    LazyWarm,
    l2_warm_of,
    next_weights_warm,
    router_warm_enabled,
    shared_expert_warm,
    warm_budget_mb,
    warm_kernel_args,
    weight_bytes,
)
from kvserve.layers.linear import Linear
from kvserve.models.decoder import DecoderForCausalLM
from kvserve.quant.registry import linear_method, resolve


def test_weight_bytes_is_the_largest_tensor_as_flat_bytes() -> None:
    layer = Linear(64, [32], bias=True, dtype=torch.bfloat16)
    flat = weight_bytes(layer)
    assert flat is not None and flat.dtype == torch.uint8
    assert flat.numel() == 64 * 32 * 2
    assert flat.data_ptr() == layer.weight.data_ptr()


def test_weight_bytes_of_an_fp8_layer_is_its_e4m3_weight() -> None:
    quant = resolve(None, "fp8")
    layer = Linear(256, [128], bias=False, dtype=torch.bfloat16, method=linear_method(quant, ["x"]))
    layer.init_dummy(torch.Generator().manual_seed(0))
    flat = weight_bytes(layer)
    assert flat is not None and flat.numel() == 256 * 128  # one byte a value; scales are smaller


def test_warm_takes_the_first_weight_then_the_second_up_to_the_budget() -> None:
    a, b = torch.zeros(1000, dtype=torch.uint8), torch.zeros(5000, dtype=torch.uint8)
    whole = l2_warm_of([a, b], 10_000)
    assert whole is not None and (whole.first_bytes, whole.second_bytes) == (1000, 5000)
    cut = l2_warm_of([a, b], 2500)
    assert cut is not None and (cut.first_bytes, cut.second_bytes) == (1000, 1500)
    first_only = l2_warm_of([b, a], 3000)
    assert first_only is not None and (first_only.first_bytes, first_only.second_bytes) == (3000, 0)
    alone = l2_warm_of([a], 10_000)
    assert alone is not None and (alone.total_bytes, alone.second_bytes) == (1000, 0)
    assert l2_warm_of([a, b], 0) is None
    assert l2_warm_of([], 1 << 20) is None


def test_kernel_args_turn_the_warm_off_without_one() -> None:
    stand_in = torch.zeros(4, dtype=torch.bfloat16)
    off = warm_kernel_args(None, stand_in)
    assert off["WARM"] is False and off["warm0_bytes"] == off["warm1_bytes"] == 0
    warm = l2_warm_of([torch.zeros(256, dtype=torch.uint8)], 128)
    on = warm_kernel_args(warm, stand_in)
    assert on["WARM"] is True and on["warm0_bytes"] == 128 and on["warm0_ptr"] is warm.first


def test_budget_setting_reads_whole_mb_and_refuses_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    warm_budget_mb.cache_clear()
    try:
        monkeypatch.delenv(WARM_ENV, raising=False)
        assert warm_budget_mb() == 0
        for good, mb in (("16", 16), ("0", 0), ("64", 64)):
            warm_budget_mb.cache_clear()
            monkeypatch.setenv(WARM_ENV, good)
            assert warm_budget_mb() == mb
        for bad in ("65", "-1", "1.5", "lots"):
            warm_budget_mb.cache_clear()
            monkeypatch.setenv(WARM_ENV, bad)
            with pytest.raises(ConfigError, match=WARM_ENV):
                warm_budget_mb()
    finally:
        warm_budget_mb.cache_clear()


def test_nothing_is_warmed_off_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A budget, or the router's switch, with CPU weights gives no warm: the requests are a GPU
    kernel's."""
    for reader in (warm_budget_mb, router_warm_enabled):
        reader.cache_clear()
    monkeypatch.setenv(WARM_ENV, "8")
    monkeypatch.setenv(ROUTER_WARM_ENV, "1")
    try:
        assert next_weights_warm([Linear(64, [64], bias=False, dtype=torch.bfloat16)]) is None
        assert shared_expert_warm(_sparse_layers(shared=True)[1].mlp) is None
    finally:
        for reader in (warm_budget_mb, router_warm_enabled):
            reader.cache_clear()


def test_a_lazy_warm_is_made_once() -> None:
    made: list[int] = []
    lazy = LazyWarm(lambda: made.append(1))  # type: ignore[arg-type, func-returns-value]
    assert lazy.get() is None and lazy.get() is None
    assert made == [1]


def _sparse_layers(shared: bool) -> list:
    moe = MoEConfig(
        num_experts=4, top_k=2, expert_intermediate_size=32, dense_layers=(0,),
        shared_expert_intermediate_size=32 if shared else 0,
    )  # fmt: skip
    cfg = ModelConfig(
        architecture="Qwen3MoeForCausalLM", vocab_size=64, hidden_size=32, intermediate_size=64,
        num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, moe=moe,
    )  # fmt: skip
    return list(DecoderForCausalLM(cfg, torch.float32, max_positions=64).model.layers)


def test_a_dense_layer_warms_o_then_gate_up_and_a_sparse_one_o_alone() -> None:
    dense, sparse = _sparse_layers(shared=False)
    assert dense.self_attn.next_layers == [dense.self_attn.o_proj, dense.mlp.gate_up_proj]
    assert sparse.self_attn.next_layers == [sparse.self_attn.o_proj]


def test_the_router_warms_the_stacked_shared_expert_gate_up_rows_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The last expert of the stack, where the shared expert sits: its gate/up rows' bytes; a
    layer without a stacked shared expert warms nothing. The CPU stands in for the GPU."""
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    router_warm_enabled.cache_clear()
    monkeypatch.setenv(ROUTER_WARM_ENV, "1")
    try:
        moe = _sparse_layers(shared=True)[1].mlp
        warm = shared_expert_warm(moe)
        assert warm is not None and moe.shared_expert
        rows = moe.w13[-1]
        assert warm.first.data_ptr() == rows.data_ptr()
        assert warm.total_bytes == rows.numel() * rows.element_size() == 2 * 32 * 32 * 4
        assert shared_expert_warm(_sparse_layers(shared=False)[1].mlp) is None
        monkeypatch.setenv(ROUTER_WARM_ENV, "0")
        router_warm_enabled.cache_clear()
        assert shared_expert_warm(moe) is None
    finally:
        router_warm_enabled.cache_clear()
