"""The fused MoE Triton path against its torch reference: batch 1 to 512, uneven expert
loads (all tokens to one expert, experts with no tokens), tile-dividing and ragged shapes, and
replay from a CUDA graph."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from kernel_test_device import (  # noqa: E402
    BF16_UNLESS_INTERPRETED,
    DEVICE,
    INTERPRETED,
    NEEDS_CUDA_GRAPHS,
)

from kvserve.kernels.fused_moe import (  # noqa: E402
    SlotOutput,
    TokenSum,
    fused_moe,
    fused_moe_reference,
    sort_slots_by_expert,
    sort_slots_by_expert_kernel,
)
from kvserve.kernels.fused_moe_half_gemv import (  # noqa: E402
    HALF_MOE_GEMV_ENV,
    fused_moe_half_gemv,
    half_moe_gemv_enabled,
    half_moe_gemv_here,
)
from kvserve.kernels.moe_routing import (  # noqa: E402
    Routing,
    grouped_sigmoid_topk,
    grouped_sigmoid_topk_reference,
    softmax_topk,
    softmax_topk_reference,
)
from kvserve.kernels.normed_router import normed_router_topk  # noqa: E402
from kvserve.kernels.rmsnorm import fused_add_rms_norm  # noqa: E402
from kvserve.kernels.router_logits import (  # noqa: E402
    LO_SHIFT,
    MIN_MMA_TOKENS,
    router_logits,
    router_topk,
)
from kvserve.kernels.word_gemv import GATED_GEMV_ENV, gated_gemv_enabled  # noqa: E402

pytestmark = pytest.mark.gpu


def _case(tokens: int, experts: int, hidden: int, inter: int, k: int, load: str, dtype):  # noqa: ANN001, ANN202
    gen = torch.Generator().manual_seed(tokens * 31 + experts)
    x = torch.randn(tokens, hidden, generator=gen).to(DEVICE, dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5).to(DEVICE, dtype)
    w2 = (torch.randn(experts, hidden, inter, generator=gen) / inter**0.5).to(DEVICE, dtype)
    scores = torch.randn(tokens, experts, generator=gen)
    if load == "one_expert":
        scores[:, 3] += 100.0  # every token's first choice is expert 3
    elif load == "few_experts":
        scores[:, 2:] -= 100.0  # only experts 0 and 1 get tokens
    weights, ids = scores.softmax(-1).topk(k, dim=-1)
    return x, w13, w2, weights.to(DEVICE), ids.to(DEVICE, torch.int32)


@pytest.mark.parametrize("dtype", [BF16_UNLESS_INTERPRETED, torch.float16])
@pytest.mark.parametrize("tokens", [1, 2, 7, 64, 256, 512])
@pytest.mark.parametrize("load", ["random", "one_expert", "few_experts"])
@pytest.mark.parametrize(("experts", "hidden", "inter", "k"), [(8, 256, 128, 2), (64, 320, 96, 8)])
def test_fused_moe_matches_reference(tokens, load, experts, hidden, inter, k, dtype) -> None:  # noqa: ANN001
    """Decode steps whose slots all fit one per block (1 token of 8 experts at k = 2; 1 and 2
    of 64 at k = 8) sum each token's k rows in the down GEMM; the rest sort."""
    x, w13, w2, weights, ids = _case(tokens, experts, hidden, inter, k, load, dtype)
    got = fused_moe(x, w13, w2, weights, ids).float()
    want = fused_moe_reference(x.float(), w13.float(), w2.float(), weights, ids)
    scale = want.abs().max().item()
    assert (got - want).abs().max().item() <= 2e-2 * scale


@pytest.fixture
def half_moe_gemv(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """KVSERVE_BF16_MOE_GEMV=1 for one test."""
    monkeypatch.setenv(HALF_MOE_GEMV_ENV, "1")
    half_moe_gemv_enabled.cache_clear()
    yield
    monkeypatch.delenv(HALF_MOE_GEMV_ENV)
    half_moe_gemv_enabled.cache_clear()


@pytest.fixture(params=[False, True], ids=["silu_kernel", "gated_gemv"])
def gated(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """KVSERVE_GATED_GEMV=0 and =1."""
    monkeypatch.setenv(GATED_GEMV_ENV, str(int(request.param)))
    gated_gemv_enabled.cache_clear()
    yield
    monkeypatch.delenv(GATED_GEMV_ENV)
    gated_gemv_enabled.cache_clear()


@pytest.mark.parametrize("dtype", [BF16_UNLESS_INTERPRETED, torch.float16])
@pytest.mark.parametrize("load", ["random", "one_expert", "few_experts"])
@pytest.mark.parametrize(
    ("tokens", "experts", "hidden", "inter", "k"),
    [(1, 8, 256, 128, 2), (1, 64, 320, 96, 8), (2, 64, 320, 96, 8)],
)
def test_decode_on_the_half_gemv_matches_reference(  # noqa: ANN201
    tokens, experts, hidden, inter, k, load, dtype, half_moe_gemv, gated  # noqa: ANN001
):  # fmt: skip
    """KVSERVE_BF16_MOE_GEMV=1: a decode step's 16-bit experts on the word GEMV, one slot a
    program row, the SiLU-mul apart or in the gate/up GEMV (KVSERVE_GATED_GEMV), the k rows and
    a shared expert's output summed in the down GEMV's epilogue."""
    x, w13, w2, weights, ids = _case(tokens, experts, hidden, inter, k, load, dtype)
    assert half_moe_gemv_here(ids.numel(), w13, w2, x)
    addend = torch.randn(x.shape, generator=torch.Generator().manual_seed(9)).to(x)
    got = fused_moe_half_gemv(x, w13, w2, weights, ids, addend=addend.clone()).float()
    want = fused_moe_reference(x.float(), w13.float(), w2.float(), weights, ids, addend=addend)
    scale = want.abs().max().item()
    assert (got - want.float()).abs().max().item() <= 2e-2 * scale


@NEEDS_CUDA_GRAPHS
def test_fused_moe_replays_from_a_cuda_graph() -> None:
    x, w13, w2, weights, ids = _case(64, 16, 256, 128, 4, "random", torch.bfloat16)
    fused_moe(x, w13, w2, weights, ids)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe(x, w13, w2, weights, ids)
    x2, _, _, weights2, ids2 = _case(64, 16, 256, 128, 4, "one_expert", torch.bfloat16)
    x.copy_(x2), weights.copy_(weights2), ids.copy_(ids2)
    graph.replay()
    torch.testing.assert_close(out, fused_moe(x, w13, w2, weights, ids), atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [BF16_UNLESS_INTERPRETED, torch.float16])
@pytest.mark.parametrize("tokens", [1, 2, 64])
def test_shared_expert_output_joins_the_sum(tokens: int, dtype: torch.dtype) -> None:
    """``addend`` is added to each token's sum: by the down GEMM's last arrival at a decode
    step (1, 2 tokens of top 8 of 64; written over the addend), after the sum when sorted."""
    x, w13, w2, weights, ids = _case(tokens, 64, 320, 96, 8, "random", dtype)
    addend = torch.randn(x.shape, generator=torch.Generator().manual_seed(tokens)).to(x)
    got = fused_moe(x, w13, w2, weights, ids, addend=addend.clone()).float()
    want = fused_moe_reference(x.float(), w13.float(), w2.float(), weights, ids, addend=addend)
    assert (got - want).abs().max().item() <= 2e-2 * want.abs().max().item()


def test_token_sums_refuse_a_tensor_of_the_wrong_shape() -> None:
    """The down GEMM writes over ``into`` in place, so it must be [tokens, N], contiguous, in the
    activations' dtype."""
    a = torch.zeros(2, 64, device=DEVICE)
    for into in (torch.zeros(3, 32, device=DEVICE), torch.zeros(32, 2, device=DEVICE).t(),
                 torch.zeros(2, 32, device=DEVICE, dtype=torch.float16)):  # fmt: skip
        with pytest.raises(ValueError, match="token sums"):
            SlotOutput.plan(a, 16, 32, 8, 16, TokenSum(into))
    plan = SlotOutput.plan(a, 16, 32, 8, 16, TokenSum())
    assert plan.out.shape == (2, 32) and plan.sums.shape == (16, 32) and plan.sum_mode == 1


@NEEDS_CUDA_GRAPHS
def test_decode_step_sums_tokens_again_on_replay() -> None:
    """The one-slot-per-block step (2 tokens, top 8 of 64) replays from a graph: the arrival
    counters of its token sums are back at zero after every launch."""
    x, w13, w2, weights, ids = _case(2, 64, 320, 96, 8, "random", torch.bfloat16)
    fused_moe(x, w13, w2, weights, ids)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe(x, w13, w2, weights, ids)
    for load in ("few_experts", "random", "one_expert"):
        x2, _, _, weights2, ids2 = _case(2, 64, 320, 96, 8, load, torch.bfloat16)
        x.copy_(x2), weights.copy_(weights2), ids.copy_(ids2)
        graph.replay()
        want = fused_moe_reference(x.float(), w13.float(), w2.float(), weights, ids)
        torch.testing.assert_close(out.float(), want, atol=2e-2 * want.abs().max().item(), rtol=0)
        torch.testing.assert_close(out, fused_moe(x, w13, w2, weights, ids), atol=0, rtol=0)


@pytest.mark.parametrize(
    ("tokens", "experts", "k", "block_m"),
    [(1, 8, 2, 16), (5, 8, 2, 4), (64, 128, 8, 16), (300, 64, 8, 64), (2048, 128, 8, 64)],
)
@pytest.mark.parametrize("parallel", [False, True], ids=["one_program", "three_passes"])
def test_sort_kernel_gives_each_expert_its_slots(tokens, experts, k, block_m, parallel) -> None:  # noqa: ANN001
    """Same block owners as the torch sort and the same slots in each expert's blocks (the
    kernels place an expert's slots in any order across its blocks), in either form."""
    gen = torch.Generator().manual_seed(tokens)
    ids = torch.randint(0, experts, (tokens, k), generator=gen)
    ids[: tokens // 2] = experts - 2  # one overloaded expert, likely some empty ones
    ref = sort_slots_by_expert(ids, experts, block_m)
    got = sort_slots_by_expert_kernel(ids.to(DEVICE), experts, block_m, parallel)
    assert got.block_expert.tolist() == ref.block_expert.tolist()

    def per_expert(s) -> dict[int, list[int]]:  # noqa: ANN001
        out: dict[int, list[int]] = {}
        for b, e in enumerate(s.block_expert.tolist()):
            out.setdefault(e, []).extend(s.slots[b * block_m : (b + 1) * block_m].tolist())
        return {e: sorted(v) for e, v in out.items()}

    assert per_expert(got) == per_expert(ref)


@pytest.mark.parametrize("shared", [False, True], ids=["routed", "shared_slot"])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize(("tokens", "experts", "k"), [(1, 8, 2), (7, 60, 4), (512, 128, 8)])
def test_softmax_topk_kernel_matches_reference(tokens, experts, k, renormalize, shared) -> None:  # noqa: ANN001
    gen = torch.Generator().manual_seed(tokens + experts)
    logits = (torch.randn(tokens, experts, generator=gen) * 3).to(DEVICE)
    weights, ids = softmax_topk(logits, k, renormalize, shared)
    ref_weights, ref_ids = softmax_topk_reference(logits, k, renormalize, shared)
    assert ids.shape == (tokens, k + shared)
    assert ids.tolist() == ref_ids.tolist()
    torch.testing.assert_close(weights, ref_weights, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [BF16_UNLESS_INTERPRETED, torch.float16, torch.float32])
@pytest.mark.parametrize(
    ("tokens", "experts", "hidden"),
    [
        (1, 128, 2048),
        (3, 60, 1000),
        (16, 128, 4096),
        (37, 160, 512),
        (256, 128, 256),
        (300, 8, 64),
        (1000, 128, 2048),
        (517, 160, 4096),
        (2048, 60, 1000),
    ],  # fmt: skip
)
def test_router_logits_kernel_matches_float32_linear(tokens, experts, hidden, dtype) -> None:  # noqa: ANN001
    """Decode-size batches on the CUDA-core kernel; prefill-size ones on the split-W
    tensor-core kernel (bf16, fp16); the rest on torch: all F.linear in fp32 up to summation
    order (and W's rounding to about 16 mantissa bits in the split)."""
    gen = torch.Generator().manual_seed(tokens * experts)
    x = torch.randn(tokens, hidden + 8, generator=gen).to(dtype).to(DEVICE)[:, :hidden]
    weight = (torch.randn(experts, hidden, generator=gen) / hidden**0.5).to(DEVICE)
    got = router_logits(x, weight)
    want = F.linear(x.float(), weight)
    assert got.dtype == torch.float32 and got.shape == (tokens, experts)
    if dtype != torch.float32 and tokens >= MIN_MMA_TOKENS:
        # The split keeps W to about 16 mantissa bits: within 2^-16 of |x| @ |W|.T of the
        # float32 GEMM, and equal to the GEMM of the split halves up to summation order
        bound = 2.0**-16 * F.linear(x.float().abs(), weight.abs())
        assert ((got - want).abs() <= bound + 1e-5).all()
        hi = weight.to(dtype)
        lo = ((weight - hi.float()) * 2.0**LO_SHIFT).to(dtype).double() / 2.0**LO_SHIFT
        x64 = x.double()
        want = (F.linear(x64, hi.double()) + F.linear(x64, lo)).float()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# (tokens, experts, groups, kept groups, k): GLM-4.5-Air (128, one group) and GLM-4.5 (160: a
# non-power-of-two row), DeepSeek-V3's grouping (256 in 8, 4 kept), uneven small groups (60 in
# 4), one-expert groups
GROUPED_CASES = [(1, 128, 1, 1, 8), (7, 160, 1, 1, 8), (5, 256, 8, 4, 8), (33, 60, 4, 2, 4),
                 (3, 8, 8, 3, 2)]  # fmt: skip


@pytest.mark.parametrize("shared", [False, True], ids=["routed", "shared_slot"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize(("tokens", "experts", "groups", "kept", "k"), GROUPED_CASES)
def test_grouped_sigmoid_topk_kernel_matches_reference(
    tokens: int,
    experts: int,
    groups: int,
    kept: int,
    k: int,
    renormalize: bool,
    bias: bool,
    shared: bool,
) -> None:
    gen = torch.Generator().manual_seed(tokens * 7 + experts)
    logits = (torch.randn(tokens, experts, generator=gen) * 2).to(DEVICE)
    correction = (torch.randn(experts, generator=gen) * 0.5).to(DEVICE) if bias else None
    args = (k, groups, kept, renormalize, 2.5, correction, shared)
    weights, ids = grouped_sigmoid_topk(logits, *args)
    ref_weights, ref_ids = grouped_sigmoid_topk_reference(logits, *args)
    assert ids.tolist() == ref_ids.tolist()
    torch.testing.assert_close(weights, ref_weights, atol=1e-6, rtol=1e-5)


def test_topk_kernels_pick_the_lowest_expert_among_equal_scores() -> None:
    """Ties (equal logits; negative choices after a correction bias) go to the lowest expert
    number, as one packed-key maximum a pick orders them."""
    logits = torch.zeros(2, 16, device=DEVICE)
    logits[1, 5] = logits[1, 9] = 1.0
    weights, ids = softmax_topk(logits, 3, True)
    assert ids.tolist() == [[0, 1, 2], [5, 9, 0]]
    torch.testing.assert_close(weights, softmax_topk_reference(logits, 3, True)[0])
    bias = torch.full((16,), -2.0, device=DEVICE)
    bias[7] = bias[3] = -1.5
    weights, ids = grouped_sigmoid_topk(logits, 3, 1, 1, False, 1.0, bias)
    assert ids.tolist() == [[3, 7, 0], [3, 7, 5]]
    assert (weights[:, :2] == 0.5).all()


# (tokens, experts, hidden, routing): Qwen3-30B-A3B's softmax top 8 of 128, GLM-4.5-Air's
# grouped sigmoid (one group) with its correction bias, DeepSeek-V3's grouping, odd sizes
ROUTER_TOPK_CASES = [
    (1, 128, 2048, Routing(128, 8, True)),
    (4, 60, 1000, Routing(60, 4, False)),
    (1, 128, 4096, Routing(128, 8, True, True, 1, 1, 1.0)),
    (3, 256, 512, Routing(256, 8, True, True, 8, 4, 2.5)),
    (2, 160, 320, Routing(160, 8, False, True, 1, 1, 2.5)),
    # a stacked shared expert (id E, weight 1.0 in each row's last column): GLM-4.5-Air's
    (1, 128, 4096, Routing(128, 8, True, True, 1, 1, 1.0, True)),
    (3, 60, 1000, Routing(60, 4, True, shared=True)),
]  # fmt: skip


@pytest.mark.parametrize("dtype", [BF16_UNLESS_INTERPRETED, torch.float16])
@pytest.mark.parametrize(("tokens", "experts", "hidden", "routing"), ROUTER_TOPK_CASES)
def test_router_topk_matches_logits_then_topk(tokens, experts, hidden, routing, dtype) -> None:  # noqa: ANN001
    """The router kernel's fused top-k picks what the top-k kernels pick from its logits, and
    again on a second launch (its arrival counters reset themselves)."""
    gen = torch.Generator().manual_seed(tokens * experts)
    x = torch.randn(tokens, hidden, generator=gen).to(dtype).to(DEVICE)
    weight = (torch.randn(experts, hidden, generator=gen) / hidden**0.5).to(DEVICE)
    bias = (
        (torch.randn(experts, generator=gen) * 0.1).to(DEVICE) if routing.grouped_sigmoid else None
    )
    logits = router_logits(x, weight)
    if routing.grouped_sigmoid:
        want = grouped_sigmoid_topk_reference(
            logits, routing.top_k, routing.num_groups, routing.topk_groups, routing.renormalize,
            routing.scaling, bias, routing.shared,
        )  # fmt: skip
    else:
        want = softmax_topk_reference(logits, routing.top_k, routing.renormalize, routing.shared)
    for _ in range(2):
        weights, ids = router_topk(x, weight, routing, bias)
        assert ids.tolist() == want[1].tolist()
        torch.testing.assert_close(weights, want[0], atol=1e-6, rtol=1e-5)


# (tokens, experts, hidden, routing): Qwen3-30B-A3B's and GLM-4.5-Air's decode steps (the
# shared expert stacked), four tokens, and sizes that fill no block
NORMED_ROUTER_CASES = [
    (1, 128, 2048, Routing(128, 8, True)),
    (1, 128, 4096, Routing(128, 8, True, True, 1, 1, 1.0, True)),
    (4, 60, 1000, Routing(60, 4, False)),
    (3, 160, 320, Routing(160, 8, False, True, 8, 4, 2.5)),
]  # fmt: skip


@pytest.mark.parametrize("dtype", [BF16_UNLESS_INTERPRETED, torch.float16])
@pytest.mark.parametrize(("tokens", "experts", "hidden", "routing"), NORMED_ROUTER_CASES)
def test_the_norm_in_the_router_gives_the_norm_then_the_router(
    tokens: int, experts: int, hidden: int, routing: Routing, dtype: torch.dtype
) -> None:
    """One launch gives the plain norm's bits (normed rows and the residual sum, the residual
    left as it was) and the experts the router kernel picks from those normed rows, on a first
    and a second launch (its arrival counter resets itself), and on a GPU a third that asks L2
    for 12 MB as it goes (``kernels.l2_warm``)."""
    gen = torch.Generator().manual_seed(tokens * experts + hidden)
    x = torch.randn(tokens, hidden, generator=gen).to(DEVICE, dtype)
    residual = (torch.randn(tokens, hidden, generator=gen) * 4).to(DEVICE, dtype)
    norm_weight = (1 + torch.randn(hidden, generator=gen) / 8).to(DEVICE, dtype)
    weight = (torch.randn(experts, hidden, generator=gen) / hidden**0.5).to(DEVICE)
    bias = (
        (torch.randn(experts, generator=gen) * 0.1).to(DEVICE) if routing.grouped_sigmoid else None
    )
    kept = residual.clone()
    want_normed, want_sum = fused_add_rms_norm(x, residual.clone(), norm_weight, 1e-6)
    want_weights, want_ids = router_topk(want_normed, weight, routing, bias)
    stack = torch.ones(12 << 20, dtype=torch.uint8, device=DEVICE)
    warms = [None, None] + ([] if INTERPRETED else [stack])
    for warm in warms:
        normed, summed, weights, ids = normed_router_topk(
            x, residual, norm_weight, 1e-6, weight, routing, bias, l2_warm=warm
        )
        assert torch.equal(normed, want_normed) and torch.equal(summed, want_sum)
        assert torch.equal(residual, kept)
        assert ids.tolist() == want_ids.tolist()
        torch.testing.assert_close(weights, want_weights, atol=1e-6, rtol=1e-5)
