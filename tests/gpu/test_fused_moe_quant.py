"""The fused MoE Triton paths with low-bit experts against their torch references: FP8
(128x128 blocks with per-token-group activations; per-channel with per-token activations) and
weight-only NVFP4 / MXFP4; batch 1 to 256, uneven expert loads (all tokens to one expert,
experts with no tokens), and replay from a CUDA graph.

On a CPU, through Triton's interpreter (fp32 activations only, tiny shapes):
``cd tests/gpu && KVSERVE_TEST_DEVICE=cpu TRITON_INTERPRET=1 python -m pytest --noconftest
test_fused_moe_quant.py``
"""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("triton")

from kernel_test_device import (  # noqa: E402
    BF16_UNLESS_INTERPRETED,
    DEVICE,
    INTERPRETED,
    NEEDS_CUDA_GRAPHS,
    ON_GPU_ONLY,
)

from kvserve.kernels import fused_moe_fp4 as fused_moe_fp4_module  # noqa: E402
from kvserve.kernels import moe_tiles  # noqa: E402
from kvserve.kernels.activation import silu_and_mul  # noqa: E402
from kvserve.kernels.fp4_reference import group_size_of  # noqa: E402
from kvserve.kernels.fp8_quant import launch_quant_kernel, quantize_fp8_reference  # noqa: E402
from kvserve.kernels.fused_moe import (  # noqa: E402
    SlotOutput,
    TokenSum,
    fused_moe,
    fused_moe_reference,
    one_slot_per_block,
)
from kvserve.kernels.fused_moe_fp4 import (  # noqa: E402
    MOE_GEMV_ENV,
    fused_moe_fp4,
    fused_moe_fp4_reference,
    moe_gemv_enabled,
)
from kvserve.kernels.fused_moe_fp8 import (  # noqa: E402
    FP8_MOE_GEMV_ENV,
    dequantize_fp8_experts,
    fp8_moe_gemv_enabled,
    fp8_moe_gemv_here,
    fused_moe_fp8,
    fused_moe_fp8_reference,
)
from kvserve.kernels.word_gemv import (  # noqa: E402
    GATED_GEMV_ENV,
    GemvConfig,
    MoeSlots,
    gated_gemv_enabled,
    launch_word_gemv,
)
from kvserve.quant.moe_fp4 import quantize_fp4_experts  # noqa: E402
from kvserve.quant.moe_fp8 import quantize_fp8_experts  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [BF16_UNLESS_INTERPRETED, torch.float16, torch.float32])
@pytest.mark.parametrize(
    ("rows", "inter", "group"), [(1, 256, 128), (9, 1408, 128), (5, 768, None)]
)
def test_gated_fp8_quant_is_silu_and_mul_then_quant(rows, inter, group, dtype) -> None:  # noqa: ANN001
    """The FP8 MoE's down input in one launch: SiLU-mul of the gate/up rows, rounded to their
    dtype, quantized per token group (or token): the bits of the two kernels it replaces and of
    the reference."""
    gen = torch.Generator().manual_seed(rows * inter)
    gate_up = (torch.randn(rows, 2 * inter + 8, generator=gen) * 3).to(DEVICE, dtype)
    gate_up = gate_up[:, : 2 * inter]  # a row stride other than the width
    q, scales = launch_quant_kernel(gate_up, group, None, False, True)
    assert q.shape == (rows, inter) and q.dtype == torch.float8_e4m3fn
    q_two, scales_two = launch_quant_kernel(silu_and_mul(gate_up), group, None, False, False)
    assert torch.equal(scales, scales_two)
    assert torch.equal(q.view(torch.uint8), q_two.view(torch.uint8))
    q_ref, scales_ref = quantize_fp8_reference(gate_up, group, gated=True)
    torch.testing.assert_close(scales, scales_ref, rtol=1e-5, atol=0)
    if INTERPRETED:
        return  # Triton 3.6's interpreter rounds -124.6 to e4m3 -64, not -128
    # torch's SiLU rounds a little differently, which can move a value by one e4m3 step
    step = torch.maximum(q.float().abs(), q_ref.float().abs()) / 8 + 2.0**-9
    assert ((q.float() - q_ref.float()).abs() <= step).all()


# (experts, hidden, inter, k): interpreter-sized, then a Qwen3-30B-A3B-like layer on the GPU
SHAPES = [(8, 256, 128, 2)] if INTERPRETED else [(8, 256, 128, 2), (128, 2048, 768, 8)]
TOKENS = [1, 5, 33] if INTERPRETED else [1, 7, 64, 256]
DTYPE = torch.float32 if INTERPRETED else torch.bfloat16
LOADS = ["random", "one_expert", "few_experts"]


def _case(tokens: int, experts: int, hidden: int, inter: int, k: int, load: str):  # noqa: ANN202
    gen = torch.Generator().manual_seed(tokens * 31 + experts)
    x = torch.randn(tokens, hidden, generator=gen).to(DEVICE, DTYPE)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5
    w2 = torch.randn(experts, hidden, inter, generator=gen) / inter**0.5
    scores = torch.randn(tokens, experts, generator=gen)
    if load == "one_expert":
        scores[:, 3] += 100.0  # every token's first choice is expert 3
    elif load == "few_experts":
        scores[:, 2:] -= 100.0  # only experts 0 and 1 get tokens
    weights, ids = scores.softmax(-1).topk(k, dim=-1)
    return x, w13.to(DEVICE), w2.to(DEVICE), weights.to(DEVICE), ids.to(DEVICE, torch.int32)


def _close(got: torch.Tensor, want: torch.Tensor, rel: float) -> None:
    scale = want.float().abs().max().item()
    assert (got.float() - want.float()).abs().max().item() <= rel * scale


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("load", LOADS)
@pytest.mark.parametrize("block", [(128, 128), None], ids=["block", "channel"])
@pytest.mark.parametrize("shape", SHAPES)
def test_fp8_experts_match_reference(tokens, load, block, shape, fp8_grouped) -> None:  # noqa: ANN001, E501
    x, w13, w2, weights, ids = _case(tokens, *shape, load)
    q13, s13 = quantize_fp8_experts(w13, block)
    q2, s2 = quantize_fp8_experts(w2, block)
    got = fused_moe_fp8(x, q13, s13, q2, s2, weights, ids, block)
    # The reference rounds the gate/up output and the SiLU-mul result to x's dtype as the
    # kernels store them: before FP8 quantization that rounding decides which way values round
    # (against an all-fp32 reference the H200 showed 3.5-4.5% at bf16, as a torch emulation of
    # the kernel's numerics does; with it, the emulation is within 0.6%).
    want = fused_moe_fp8_reference(x, q13, s13, q2, s2, weights, ids, block)
    _close(got, want, 1e-3 if torch.float32 == DTYPE else 3e-2)


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("load", LOADS)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("shape", SHAPES)
def test_fp4_experts_match_reference(tokens, load, fmt, shape, grouped_mma) -> None:  # noqa: ANN001
    assert not moe_gemv_enabled()
    x, w13, w2, weights, ids = _case(tokens, *shape, load)
    s13, s2 = quantize_fp4_experts(w13, fmt), quantize_fp4_experts(w2, fmt)
    got = fused_moe_fp4(x, s13, s2, weights, ids)
    want = fused_moe_fp4_reference(x.float(), s13, s2, weights, ids)
    _close(got, want, 1e-4 if torch.float32 == DTYPE else 2e-2)


@pytest.mark.parametrize("load", ["random", "one_expert"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_fp4_prefill_dequantized_in_chunks_matches_reference(fmt, load, monkeypatch) -> None:  # noqa: ANN001
    """A step with DEQUANT_MIN_SLOTS_PER_EXPERT slots an expert: the experts are dequantized a
    chunk at a time (2 of 8 a chunk for gate/up, 4 for down here) and multiplied by the
    grouped GEMM of fused_moe; every chunk's rows land, and no others are overwritten."""
    experts, hidden, inter, k = 8, 256, 128, 2
    monkeypatch.setattr(fused_moe_fp4_module, "DEQUANT_MIN_SLOTS_PER_EXPERT", 128)  # fewer tokens
    tokens = 128 * experts // k
    x, w13, w2, weights, ids = _case(tokens, experts, hidden, inter, k, load)
    s13, s2 = quantize_fp4_experts(w13, fmt), quantize_fp4_experts(w2, fmt)
    chunks = []  # rows of each dequantized chunk
    dequantize = fused_moe_fp4_module.dequantize_fp4_dense
    chunk_bytes = 2 * 2 * inter * hidden * 4
    monkeypatch.setattr(fused_moe_fp4_module, "DEQUANT_CHUNK_BYTES", chunk_bytes)
    monkeypatch.setattr(
        fused_moe_fp4_module, "dequantize_fp4_dense",
        lambda *args: chunks.append(args[0].shape[0]) or dequantize(*args),
    )  # fmt: skip
    got = fused_moe_fp4(x, s13, s2, weights, ids)
    per13 = chunk_bytes // (2 * inter * hidden * x.element_size())  # 2 in fp32, 4 in bf16
    per2 = chunk_bytes // (hidden * inter * x.element_size())
    want_chunks = [per13 * 2 * inter] * (experts // per13) + [per2 * hidden] * (experts // per2)
    assert chunks == want_chunks
    want = fused_moe_fp4_reference(x.float(), s13, s2, weights, ids)
    _close(got, want, 1e-4 if torch.float32 == DTYPE else 2e-2)


@pytest.mark.parametrize("tokens", [1, 7])
@pytest.mark.parametrize("fmt", ["fp8-block", "nvfp4"])
def test_shared_expert_output_is_added(fmt: str, tokens: int, fp8_grouped) -> None:  # noqa: ANN001
    """``addend`` (a shared expert's output) joins the sum: in the down GEMM's token sum at a
    one-slot-per-block step (1 token of 8 experts at k = 2), after the sum when sorted."""
    x, w13, w2, weights, ids = _case(tokens, 8, 256, 128, 2, "random")
    addend = torch.randn(x.shape, generator=torch.Generator().manual_seed(tokens)).to(x)
    if fmt == "nvfp4":
        f13, f2 = quantize_fp4_experts(w13, fmt), quantize_fp4_experts(w2, fmt)
        want = fused_moe_fp4_reference(x.float(), f13, f2, weights, ids)
        got = fused_moe_fp4(x, f13, f2, weights, ids, addend=addend.clone())
    else:
        q13, s13 = quantize_fp8_experts(w13, (128, 128))
        q2, s2 = quantize_fp8_experts(w2, (128, 128))
        want = fused_moe_fp8_reference(x, q13, s13, q2, s2, weights, ids, (128, 128))
        got = fused_moe_fp8(x, q13, s13, q2, s2, weights, ids, (128, 128), addend=addend.clone())
    _close(got, want.float() + addend.float(), 1e-3 if torch.float32 == DTYPE else 3e-2)


@pytest.mark.parametrize("dtype", [BF16_UNLESS_INTERPRETED, torch.float16])
def test_half_activations(dtype, fp8_grouped) -> None:  # noqa: ANN001
    x, w13, w2, weights, ids = _case(9, 8, 256, 128, 2, "random")
    x = x.to(dtype)
    q13, s13 = quantize_fp8_experts(w13, (128, 128))
    q2, s2 = quantize_fp8_experts(w2, (128, 128))
    got = fused_moe_fp8(x, q13, s13, q2, s2, weights, ids, (128, 128))
    _close(got, fused_moe_fp8_reference(x, q13, s13, q2, s2, weights, ids, (128, 128)), 3e-2)
    f13, f2 = quantize_fp4_experts(w13, "nvfp4"), quantize_fp4_experts(w2, "nvfp4")
    got = fused_moe_fp4(x, f13, f2, weights, ids)
    _close(got, fused_moe_fp4_reference(x.float(), f13, f2, weights, ids), 2e-2)


@NEEDS_CUDA_GRAPHS
@pytest.mark.parametrize("fmt", ["fp8-block", "fp8-channel", "nvfp4", "mxfp4"])
def test_replays_from_a_cuda_graph(fmt: str) -> None:
    x, w13, w2, weights, ids = _case(64, 16, 256, 128, 4, "random")
    if fmt.startswith("fp8"):
        block = (128, 128) if fmt == "fp8-block" else None
        q13, s13 = quantize_fp8_experts(w13, block)
        q2, s2 = quantize_fp8_experts(w2, block)

        def run():  # noqa: ANN202
            return fused_moe_fp8(x, q13, s13, q2, s2, weights, ids, block)
    else:
        f13, f2 = quantize_fp4_experts(w13, fmt), quantize_fp4_experts(w2, fmt)

        def run():  # noqa: ANN202
            return fused_moe_fp4(x, f13, f2, weights, ids)

    run()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    x2, _, _, weights2, ids2 = _case(64, 16, 256, 128, 4, "one_expert")
    x.copy_(x2), weights.copy_(weights2), ids.copy_(ids2)
    graph.replay()
    torch.testing.assert_close(out, run(), atol=0, rtol=0)


def _switch_env(monkeypatch: pytest.MonkeyPatch, name: str, value: str, cached):  # noqa: ANN001, ANN202
    """``name=value`` for one test, ``cached`` (the functools.cache that reads it) cleared."""
    monkeypatch.setenv(name, value)
    cached.cache_clear()
    yield
    monkeypatch.delenv(name)
    cached.cache_clear()


@pytest.fixture
def moe_gemv(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """KVSERVE_FP4_MOE_GEMV=1 (the default) for one test."""
    yield from _switch_env(monkeypatch, MOE_GEMV_ENV, "1", moe_gemv_enabled)


@pytest.fixture
def grouped_mma(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """KVSERVE_FP4_MOE_GEMV=0 for one test: decode steps too on the grouped MMA kernel."""
    yield from _switch_env(monkeypatch, MOE_GEMV_ENV, "0", moe_gemv_enabled)


@pytest.fixture
def fp8_moe_gemv(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """KVSERVE_FP8_MOE_GEMV=1 (the default) for one test: FP8 experts' decode steps on the
    word GEMV."""
    yield from _switch_env(monkeypatch, FP8_MOE_GEMV_ENV, "1", fp8_moe_gemv_enabled)


@pytest.fixture
def fp8_grouped(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """KVSERVE_FP8_MOE_GEMV=0 for one test: FP8 experts' decode steps too on the grouped
    kernel, which quantizes the activations as the reference does."""
    yield from _switch_env(monkeypatch, FP8_MOE_GEMV_ENV, "0", fp8_moe_gemv_enabled)


@pytest.fixture(params=[False, True], ids=["silu_kernel", "gated_gemv"])
def gated_gemv(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """KVSERVE_GATED_GEMV=0 and =1: the SiLU-mul in its own kernel or in the gate/up GEMV."""
    yield from _switch_env(monkeypatch, GATED_GEMV_ENV, str(int(request.param)),
                           gated_gemv_enabled)  # fmt: skip


# (shape, tokens) of decode-sized steps, slots * 4 <= experts: the ones that take the GEMV
DECODE_CASES = [(shape, t) for shape in SHAPES for t in ([1] if INTERPRETED else [1, 3])
                if t * shape[3] * 4 <= shape[0]]  # fmt: skip


@pytest.mark.parametrize("load", LOADS)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize(("shape", "tokens"), DECODE_CASES)
def test_fp4_decode_on_the_gemv_matches_reference(  # noqa: ANN201
    shape, tokens, fmt, load, moe_gemv, gated_gemv  # noqa: ANN001
):  # fmt: skip
    """Decode steps on the word GEMV, split K included, the SiLU-mul apart or in the gate/up
    GEMV."""
    assert moe_gemv_enabled()
    x, w13, w2, weights, ids = _case(tokens, *shape, load)
    s13, s2 = quantize_fp4_experts(w13, fmt), quantize_fp4_experts(w2, fmt)
    got = fused_moe_fp4(x, s13, s2, weights, ids)
    want = fused_moe_fp4_reference(x.float(), s13, s2, weights, ids)
    _close(got, want, 1e-4 if torch.float32 == DTYPE else 2e-2)


@pytest.mark.parametrize("load", LOADS)
@pytest.mark.parametrize("block", [(128, 128), None], ids=["block", "channel"])
@pytest.mark.parametrize(("shape", "tokens"), DECODE_CASES)
def test_fp8_decode_on_the_gemv_matches_weight_only_reference(  # noqa: ANN201
    shape, tokens, block, load, fp8_moe_gemv, gated_gemv  # noqa: ANN001
):  # fmt: skip
    """KVSERVE_FP8_MOE_GEMV=1: a decode step's FP8 experts weight-only on the word GEMV (half
    sums on the GPU), the SiLU-mul apart or in the gate/up GEMV, each token's k rows and a
    shared expert's output summed in the down GEMV's epilogue: the dequantized experts'
    product without activation quantization."""
    x, w13, w2, weights, ids = _case(tokens, *shape, load)
    (q13, s13), (q2, s2) = quantize_fp8_experts(w13, block), quantize_fp8_experts(w2, block)
    assert fp8_moe_gemv_here(ids.numel(), q13, block)
    addend = torch.randn(x.shape, generator=torch.Generator().manual_seed(5)).to(x)
    got = fused_moe_fp8(x, q13, s13, q2, s2, weights, ids, block, addend=addend.clone())
    w13_f, w2_f = dequantize_fp8_experts(q13, s13, block), dequantize_fp8_experts(q2, s2, block)
    want = fused_moe_reference(x.float(), w13_f, w2_f, weights, ids, None, x.dtype, addend)
    _close(got, want, 1e-4 if torch.float32 == DTYPE else 2e-2)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_fp4_moe_gemv_runs_a_tuned_config(fmt: str) -> None:
    """A ``*_gemv`` table entry's fields (``moe_tiles``) reach the GEMV: narrow, split tiles
    give the default's result."""
    x, w13, _, _, ids = _case(1, 8, 256, 128, 2, "random")
    s13 = quantize_fp4_experts(w13, fmt)
    flat = ids.flatten().contiguous()
    tuned = {"block_n": 16, "block_w": 16, "split_k": 2, "num_warps": 4, "num_stages": 3}
    got = fused_moe_fp4_module._fp4_moe_gemv(x, s13, flat, 2, None, config=tuned)
    want = fused_moe_fp4_module._fp4_moe_gemv(x, s13, flat, 2, None)
    _close(got, want, 1e-5 if torch.float32 == DTYPE else 1e-2)


@pytest.mark.parametrize("split_k", [1, 2])  # K = 128: two steps of 8 words
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("accumulate", [False, True], ids=["new", "addend"])
def test_fp4_gemv_sums_each_tokens_rows(accumulate: bool, fmt: str, split_k: int) -> None:
    """The down GEMV of a decode step sums each token's k router-weighted rows in its epilogue
    (after its own split-K reduction when K is split), into a new tensor or onto an addend; and
    twice in a row, so the arrival counters are back at zero after each launch."""
    tokens, experts, hidden, inter, k = 2, 16, 256, 128, 4
    x, _, w2, weights, ids = _case(tokens, experts, hidden, inter, k, "random")
    stack = quantize_fp4_experts(w2, fmt)
    a = torch.randn(tokens * k, inter, generator=torch.Generator().manual_seed(5)).to(x)
    dense = fused_moe_fp4_module.dequantize_fp4_experts(stack)
    flat_ids, flat_w = ids.flatten(), weights.flatten().float()
    rows = torch.einsum("si,sni->sn", a.float(), dense[flat_ids.long()]) * flat_w[:, None]
    addend = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(6)).to(x)
    want = rows.view(tokens, k, hidden).sum(1) + (addend.float() if accumulate else 0.0)
    cfg = GemvConfig(block_n=64, block_w=8, split_k=split_k)
    for _ in range(2):
        into = addend.clone() if accumulate else None
        dest = SlotOutput.plan(a, tokens * k, hidden, k, cfg.block_n, TokenSum(into))
        slots = MoeSlots(flat_ids, k, False, flat_w, dest)
        launch_word_gemv(a, stack[0], stack[1], stack[2], None, dest.out, cfg,
                         group_size_of(stack[1]), slots)  # fmt: skip
        assert dest.out.shape == (tokens, hidden)
        _close(dest.out, want, 1e-4 if torch.float32 == DTYPE else 2e-2)


@NEEDS_CUDA_GRAPHS
def test_fp4_decode_on_the_gemv_replays_from_a_cuda_graph(moe_gemv) -> None:  # noqa: ANN001
    x, w13, w2, weights, ids = _case(2, 64, 256, 128, 4, "random")
    f13, f2 = quantize_fp4_experts(w13, "nvfp4"), quantize_fp4_experts(w2, "nvfp4")
    fused_moe_fp4(x, f13, f2, weights, ids)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_moe_fp4(x, f13, f2, weights, ids)
    x2, _, _, weights2, ids2 = _case(2, 64, 256, 128, 4, "one_expert")
    x.copy_(x2), weights.copy_(weights2), ids.copy_(ids2)
    graph.replay()
    torch.testing.assert_close(out, fused_moe_fp4(x, f13, f2, weights, ids), atol=0, rtol=0)


def _shipped_tiles() -> list:
    """Each distinct (kind, one slot a block, tile, N and K for a GEMV tile) of the shipped
    tuned tables."""
    seen = {}
    for path in sorted(moe_tiles.TABLE_DIR.glob("*.json")):
        for key, entries in json.loads(path.read_text())["shapes"].items():
            kind, e, n, k, top_k = (f.split("=")[-1] for f in key.split())
            gemv_nk = (int(n), int(k)) if kind.endswith("_gemv") else None
            for tokens, entry in entries.items():
                one_slot = one_slot_per_block(int(tokens) * int(top_k), int(e))
                for tile in entry.values():
                    case = (kind, one_slot, tile, gemv_nk)
                    seen[(kind, one_slot, tuple(tile.items()), gemv_nk)] = case
    return [pytest.param(*case, id="-".join(map(str, case))) for case in seen.values()]


def _tuned_step(kind: str, x, w13, w2, weights, ids):  # noqa: ANN001, ANN202
    """(the MoE path of ``kind`` on these experts, its reference)."""
    if kind == "bfloat16":
        got = fused_moe(x, w13.to(DTYPE), w2.to(DTYPE), weights, ids)
        return got, fused_moe_reference(x.float(), w13.float(), w2.float(), weights, ids)
    if kind.startswith("fp8"):
        block = (128, 128) if kind.startswith("fp8_block") else None
        q13, s13 = quantize_fp8_experts(w13, block)
        q2, s2 = quantize_fp8_experts(w2, block)
        got = fused_moe_fp8(x, q13, s13, q2, s2, weights, ids, block)
        if not kind.endswith("_gemv"):
            return got, fused_moe_fp8_reference(x, q13, s13, q2, s2, weights, ids, block)
        # the GEMV is weight-only: the dequantized experts' product, activations unquantized
        w13_f, w2_f = dequantize_fp8_experts(q13, s13, block), dequantize_fp8_experts(q2, s2, block)
        return got, fused_moe_reference(x.float(), w13_f, w2_f, weights, ids, None, x.dtype)
    fmt = kind.removesuffix("_gemv")
    s13, s2 = quantize_fp4_experts(w13, fmt), quantize_fp4_experts(w2, fmt)
    got = fused_moe_fp4(x, s13, s2, weights, ids)
    return got, fused_moe_fp4_reference(x.float(), s13, s2, weights, ids)


@ON_GPU_ONLY
@pytest.mark.parametrize(("kind", "one_slot", "tile", "gemv_nk"), _shipped_tiles())
def test_shipped_tuned_tiles_match_reference(
    kind, one_slot, tile, gemv_nk, tmp_path, monkeypatch
) -> None:  # noqa: ANN001, E501
    """Every tile of the shipped tables, written into a table for this GPU and a small step,
    runs both GEMMs of a step of its kind (one slot a block or sorted; the word GEMV for
    ``*_gemv``, at the shape it was tuned for, N and K, with 8 experts) to the reference."""
    experts, hidden, inter, k = 8, 256, 128, 2
    if gemv_nk:
        hidden, inter = gemv_nk[1], gemv_nk[0] // 2
    x, w13, w2, weights, ids = _case(1 if one_slot else 64, experts, hidden, inter, k, "random")
    shape = moe_tiles.MoeShape(kind, experts, 2 * inter, hidden, k)
    table = {"shapes": {shape.key(): {"1": {"gate_up": tile, "down": tile}}}}
    monkeypatch.setattr(moe_tiles, "TABLE_DIR", tmp_path)
    moe_tiles.table_path(torch.cuda.get_device_name()).write_text(json.dumps(table))
    moe_tiles.reload_tables()
    switches = ((MOE_GEMV_ENV, fused_moe_fp4_module.moe_gemv_enabled),
                (FP8_MOE_GEMV_ENV, fp8_moe_gemv_enabled))  # fmt: skip
    for env, cached in switches:
        monkeypatch.setenv(env, "1" if gemv_nk else "0")
        cached.cache_clear()
    try:
        assert moe_tiles.moe_tiles(shape, 64, DEVICE, {}).gate_up == tile
        got, want = _tuned_step(kind, x, w13, w2, weights, ids)
    finally:
        moe_tiles.reload_tables()
        for _, cached in switches:
            cached.cache_clear()
    _close(got, want, 3e-2)
