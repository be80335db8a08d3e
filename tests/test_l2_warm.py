"""The router's L2 warm of a stacked shared expert (``kvserve.kernels.l2_warm``): which bytes a
MoE layer asks for, and its setting. The kernel's requests are checked where they can run:
built for sm_90 (``tests/sm90_builds/test_moe_builds.py``) and on the GPU
(``tests/gpu/test_fused_moe.py``)."""

from __future__ import annotations

import pytest
import torch

from kvserve.config import ModelConfig, MoEConfig
from kvserve.errors import ConfigError
from kvserve.kernels.l2_warm import ROUTER_WARM_ENV, router_warm_enabled, shared_expert_warm
from kvserve.models.decoder import DecoderForCausalLM


@pytest.fixture
def router_warm(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """Sets ``KVSERVE_ROUTER_L2_WARM`` for the test (the reader caches what it read)."""

    def set_to(value: str) -> None:
        monkeypatch.setenv(ROUTER_WARM_ENV, value)
        router_warm_enabled.cache_clear()

    yield set_to
    router_warm_enabled.cache_clear()


def _moe_layer(shared: bool) -> torch.nn.Module:
    moe = MoEConfig(
        num_experts=4, top_k=2, expert_intermediate_size=32,
        shared_expert_intermediate_size=32 if shared else 0,
    )  # fmt: skip
    cfg = ModelConfig(
        architecture="Qwen3MoeForCausalLM", vocab_size=64, hidden_size=32, intermediate_size=64,
        num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8, moe=moe,
    )  # fmt: skip
    return DecoderForCausalLM(cfg, torch.float32, max_positions=64).model.layers[0].mlp


def test_the_switch_reads_0_or_1_and_refuses_the_rest(router_warm) -> None:  # noqa: ANN001
    assert router_warm_enabled() is False  # unset: off
    router_warm("1")
    assert router_warm_enabled() is True
    router_warm("yes")
    with pytest.raises(ConfigError, match=ROUTER_WARM_ENV):
        router_warm_enabled()


def test_nothing_is_warmed_off_the_gpu(router_warm) -> None:  # noqa: ANN001
    router_warm("1")
    assert shared_expert_warm(_moe_layer(shared=True)) is None


def test_the_router_warms_the_stacked_shared_expert_gate_up_rows_only(
    monkeypatch: pytest.MonkeyPatch,
    router_warm,  # noqa: ANN001
) -> None:
    """The last expert of the stack, where the shared expert sits: its gate/up rows' bytes; a
    layer without a stacked shared expert warms nothing. The CPU stands in for the GPU."""
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))
    router_warm("1")
    moe = _moe_layer(shared=True)
    assert moe.shared_expert
    warm = moe.router_warm
    rows = moe.w13[-1]
    assert warm is not None and warm.dtype == torch.uint8
    assert warm.data_ptr() == rows.data_ptr()
    assert warm.numel() == rows.numel() * rows.element_size() == 2 * 32 * 32 * 4
    assert moe.router_warm is warm  # read once, at the first step
    assert _moe_layer(shared=False).router_warm is None
    router_warm("0")
    assert shared_expert_warm(moe) is None
