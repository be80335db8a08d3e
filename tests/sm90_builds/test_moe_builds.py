"""The mixture-of-experts kernels built for sm_90 as a step launches them: the router (logits
with the fused top-k at decode, the split MMA for long prefills, then softmax or GLM's grouped
sigmoid top-k), and the experts in bf16, FP8 128 x 128 blocks and NVFP4: a decode step on the
word GEMV (the gate/up's SiLU-mul and the token sum in its epilogues), a batch sorted into
expert blocks on the grouped kernels. Qwen3-30B-A3B's experts (128, hidden 2048, 768 wide, top
8) and GLM-4.5-Air's (hidden 4096, 1408 wide, top 8 and the shared expert stacked as a 129th).
Expert stacks are ``torch.empty``: nothing is launched, so nothing is read.

The experts build at the H200's tuned tiles (``moe_configs/NVIDIA_H200.json``, looked up by
its name, as the engine does on that GPU) and at the heuristic tiles of an untuned GPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from triton_target import stack_bytes  # noqa: E402

from kvserve.kernels.fused_moe import fused_moe  # noqa: E402
from kvserve.kernels.fused_moe_fp4 import fused_moe_fp4  # noqa: E402
from kvserve.kernels.fused_moe_fp8 import fused_moe_fp8  # noqa: E402
from kvserve.kernels.moe_routing import Routing, grouped_sigmoid_topk, softmax_topk  # noqa: E402
from kvserve.kernels.normed_router import normed_router_topk  # noqa: E402
from kvserve.kernels.router_logits import router_logits, router_topk  # noqa: E402

FP8 = torch.float8_e4m3fn
# experts (the shared one stacked last), hidden, expert width, top-k (the shared slot included)
MODELS = {"qwen3-moe": (128, 2048, 768, 8, False), "glm-air": (129, 4096, 1408, 9, True)}


def _routing(model: str) -> tuple[Routing, torch.Tensor | None]:
    """GLM's sigmoid scores over 8 groups, the best 4, with a correction bias and the shared
    slot; Qwen3's softmax top 8."""
    experts, _, _, top_k, shared = MODELS[model]
    routed = experts - shared
    if shared:
        return Routing(routed, top_k - 1, True, True, 8, 4, 2.5, shared=True), torch.zeros(routed)
    return Routing(routed, top_k, True), None


def _route(model: str, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    experts, _, _, top_k, _ = MODELS[model]
    ids = (torch.arange(tokens * top_k, dtype=torch.int32) % experts).view(tokens, top_k)
    return torch.full((tokens, top_k), 1.0 / top_k), ids


def _experts(model: str, tokens: int, fmt: str) -> None:
    experts, hidden, width, _, shared = MODELS[model]
    x = torch.zeros(tokens, hidden, dtype=torch.bfloat16)
    weights, ids = _route(model, tokens)
    if fmt == "bf16":
        w13 = torch.empty(experts, 2 * width, hidden, dtype=torch.bfloat16)
        w2 = torch.empty(experts, hidden, width, dtype=torch.bfloat16)
        fused_moe(x, w13, w2, weights, ids, pdl=True, shared=shared)
    elif fmt == "fp8-block":
        w13 = torch.empty(experts, 2 * width, hidden, dtype=FP8)
        w2 = torch.empty(experts, hidden, width, dtype=FP8)
        s13 = torch.ones(experts, -(-2 * width // 128), hidden // 128)
        s2 = torch.ones(experts, hidden // 128, -(-width // 128))
        fused_moe_fp8(x, w13, s13, w2, s2, weights, ids, (128, 128), pdl=True, shared=shared)
    else:
        w13 = _nvfp4_stack(experts, 2 * width, hidden)
        w2 = _nvfp4_stack(experts, hidden, width)
        fused_moe_fp4(x, w13, w2, weights, ids, pdl=True, shared=shared)


def _nvfp4_stack(experts: int, n: int, k: int) -> tuple[torch.Tensor, ...]:
    """Codes, e4m3 scales per 16 values and a per-tensor scale per expert."""
    codes = torch.empty(experts, n, k // 2, dtype=torch.uint8)
    return codes, torch.empty(experts, n, k // 16, dtype=FP8), torch.ones(experts)


@pytest.fixture(params=["h200-tiles", "heuristic-tiles"])
def tiles(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The H200's tuned tiles for a step on this CPU (the engine asks the table of the CUDA
    device it runs on), or the heuristic tiles every step takes without a table."""
    from kvserve.kernels import moe_tiles

    def h200_tiles(shape, tokens, device, fallback):  # noqa: ANN001, ANN202 - moe_tiles' own
        tuned = moe_tiles.tuned_tiles(shape, tokens, "NVIDIA H200")
        return tuned if tuned is not None else moe_tiles.MoeTiles(fallback, fallback)

    if request.param == "h200-tiles":
        monkeypatch.setattr(moe_tiles, "moe_tiles", h200_tiles)
    return request.param


@pytest.mark.parametrize("fmt", ["bf16", "fp8-block", "nvfp4"])
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("tokens", [1, 64, 512], ids=["decode", "batch-64", "prefill-512"])
def test_the_experts_build_for_sm90_without_spills(
    compile_only: list, tiles: str, fmt: str, model: str, tokens: int
) -> None:
    _experts(model, tokens, fmt)
    assert stack_bytes(compile_only) == [0] * len(compile_only)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("tokens", [1, 4, 16, 2048])
def test_the_router_builds_for_sm90_without_spills(
    compile_only: list, model: str, tokens: int
) -> None:
    """Up to 4 tokens the logits and top-k in one launch; to 16 on CUDA cores, then the top-k
    kernel; long prefills on the split MMA."""
    experts, hidden, _, top_k, shared = MODELS[model]
    x = torch.zeros(tokens, hidden, dtype=torch.bfloat16)
    weight = torch.zeros(experts - shared, hidden)
    routing, bias = _routing(model)
    if tokens <= 4:
        router_topk(x, weight, routing, bias, pdl=True)
    elif shared:
        logits = router_logits(x, weight, pdl=True)
        grouped_sigmoid_topk(logits, top_k - 1, 8, 4, True, 2.5, bias, True, pdl=True)
    else:
        softmax_topk(router_logits(x, weight, pdl=True), top_k, True, pdl=True)
    assert stack_bytes(compile_only) == [0] * len(compile_only)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("tokens", [1, 4])
@pytest.mark.parametrize("warm", [False, True])
def test_the_norm_in_the_router_builds_for_sm90_without_spills(
    compile_only: list, model: str, tokens: int, warm: bool
) -> None:
    """With ``warm``, the kernel also asks L2 for a shared expert's rows (``kernels.l2_warm``)
    once the kernel before is done: its requests come after the dependent-launch wait."""
    experts, hidden, _, _, shared = MODELS[model]
    x = torch.zeros(tokens, hidden, dtype=torch.bfloat16)
    routing, bias = _routing(model)
    weight = torch.zeros(experts - shared, hidden)
    stack = torch.zeros(1 << 20, dtype=torch.uint8)
    l2_warm = stack if warm else None
    normed_router_topk(x, x, x[0], 1e-6, weight, routing, bias, pdl=True, l2_warm=l2_warm)
    assert stack_bytes(compile_only) == [0] * len(compile_only)
    ptx = compile_only[-1].asm["ptx"]
    assert ("prefetch.global.L2" in ptx) == warm
    assert not warm or ptx.index("prefetch.global.L2") > ptx.index("griddepcontrol.wait")
