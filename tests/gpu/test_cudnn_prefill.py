"""cuDNN's paged SDPA as the triton backend's prefill (``kvserve.layers.attention.cudnn_prefill``)
against the torch backend in fp32: mixed steps (leading decodes, chunks behind cached prefixes,
fresh prompts), pages in random order, q as a strided view of a fused qkv, and the shape buckets
that decide how many graphs cuDNN builds. Needs an sm_90 GPU and ``nvidia-cudnn-frontend``."""

from __future__ import annotations

import pytest
import torch
from kernel_test_device import DEVICE
from test_attention_kernels import TOL, make_batch, reference

from kvserve.layers.attention import cudnn_prefill
from kvserve.layers.attention.cudnn_prefill import CudnnPrefill, cudnn_prefill_unavailable
from kvserve.layers.attention.triton_backend import TritonAttentionBackend

pytestmark = pytest.mark.gpu
pytest.importorskip("cudnn")
_REASON = cudnn_prefill_unavailable(DEVICE, torch.bfloat16, torch.bfloat16, 128)
if _REASON is not None:  # a CPU, a GPU other than sm_90, or a cuDNN without paged caches
    pytest.skip(f"cuDNN prefill cannot run here: {_REASON}", allow_module_level=True)

# (query lens, sequence lens): leading decodes then chunks (the scheduler's order); a chunk
# behind a prefix ending mid-page; a fresh prompt; one long chunk; batches that pad to 4 and 8
CASES = [
    ([1, 1, 37, 200], [50, 900, 37, 1000]),
    ([513], [513]),
    ([64, 3, 100], [64, 300, 2000]),
    ([1, 256, 256, 17, 90], [7, 256, 4096, 17, 91]),
]
# (head_dim, Hq, Hkv, page_size, dtype)
SHAPES = [(128, 32, 8, 16, torch.bfloat16), (64, 8, 4, 64, torch.float16),
          (128, 8, 8, 32, torch.bfloat16)]  # fmt: skip


@pytest.fixture
def every_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small test steps take cuDNN too (the engine's threshold keeps them on Triton)."""
    monkeypatch.setattr(cudnn_prefill, "MIN_PAIRS", 0)


@pytest.mark.usefixtures("every_step")
@pytest.mark.parametrize("strided_q", [False, True])
@pytest.mark.parametrize(("head_dim", "hq", "hkv", "page", "dtype"), SHAPES)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_cudnn_prefill_matches_reference(
    case: int, head_dim: int, hq: int, hkv: int, page: int, dtype: torch.dtype, strided_q: bool
) -> None:
    qlens, slens = CASES[case]
    b = make_batch(qlens, slens, page_size=page, num_heads=hq, num_kv_heads=hkv,
                   head_dim=head_dim, dtype=dtype, seed=case)  # fmt: skip
    q = b.q
    if strided_q:  # the attention layer's q: the first Hq heads of each token's fused qkv row
        qkv = torch.randn(q.shape[0], hq + 2 * hkv, head_dim, dtype=dtype, device=DEVICE)
        qkv[:, :hq] = q
        q = qkv[:, :hq]
    want = reference(b)
    backend = TritonAttentionBackend(prefill=CudnnPrefill(DEVICE))
    got = backend.forward(q, b.k, b.v, b.kv_cache, b.meta, head_dim**-0.5)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), want, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.usefixtures("every_step")
def test_one_graph_per_bucket() -> None:
    """Steps whose batch, longest chunk and page-table width round to the same powers of two
    share a graph (the engine's tables are as wide as a step's longest sequence)."""
    library = CudnnPrefill(DEVICE)
    backend = TritonAttentionBackend(prefill=library)
    # (query lens, sequence lens, table width)
    steps = [([100, 70], [100, 300], 40), ([120, 1], [500, 640], 64), ([65, 128], [65, 128], 33),
             ([300], [300], 24), ([300], [600], 40)]  # fmt: skip
    for qlens, slens, width in steps:
        spare = 100 - sum(-(-n // 16) for n in slens)  # one pool size for every step
        b = make_batch(qlens, slens, page_size=16, num_heads=8, num_kv_heads=2, head_dim=64,
                       dtype=torch.bfloat16, spare_pages=spare, min_table_width=width)  # fmt: skip
        assert b.meta.block_tables.shape[1] == width
        got = backend.forward(b.q, b.k, b.v, b.kv_cache, b.meta, 0.125)
        torch.testing.assert_close(got.float(), reference(b), atol=TOL[torch.bfloat16],
                                   rtol=TOL[torch.bfloat16])  # fmt: skip
    # (batch, longest chunk, width) buckets: (2, 128, 64) x 3, (1, 512, 32), (1, 512, 64)
    assert sorted((g.batch, g.max_query, g.table_width) for g in library._graphs) == [
        (1, 512, 32),
        (1, 512, 64),
        (2, 128, 64),
    ]


def test_small_steps_stay_on_triton() -> None:
    library = CudnnPrefill(DEVICE)
    b = make_batch([1, 40], [30, 40], page_size=16, num_heads=8, num_kv_heads=2, head_dim=64,
                   dtype=torch.bfloat16)  # fmt: skip
    assert library.step_inputs(b.meta, 1) is None
    backend = TritonAttentionBackend(prefill=library)
    got = backend.forward(b.q, b.k, b.v, b.kv_cache, b.meta, 0.125)
    torch.testing.assert_close(got.float(), reference(b), atol=TOL[torch.bfloat16],
                               rtol=TOL[torch.bfloat16])  # fmt: skip
    assert not library._graphs


def _first_token_logprobs(core, prompts: list[list[int]]) -> list:  # noqa: ANN001
    """The greedy first token of each prompt and its top-5 logprobs (the prefill's logits)."""
    from kvserve.engine.core.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=1, logprobs=5)
    for i, prompt in enumerate(prompts):
        core.add_request(str(i), prompt, params)
    got = {}
    while core.has_unfinished():
        for o in core.step():
            if o.new_logprobs:
                got[o.request_id] = o.new_logprobs[0]
    return [got[str(i)] for i in range(len(prompts))]


@pytest.mark.usefixtures("every_step")
def test_engine_with_cudnn_prefill_is_as_close_to_float32_as_triton(tmp_path) -> None:  # noqa: ANN001
    """Every prefill step of a bf16 engine on cuDNN, prompts in 256-token chunks (so chunks run
    behind cached prefixes): the prompts' top-5 first-token logprobs are as close to a float32
    engine's as the bf16 Triton kernel's are. A wiring fault (wrong pages, rows or lengths) would
    be far off; bf16 rounding is not, and greedy continuations of two bf16 engines part at
    near-ties, so tokens are compared only where the float32 margin is clear."""
    from test_engine_gpu import PROMPTS, _tiny_checkpoint

    from kvserve.engine.config_builder import build_engine_config
    from kvserve.engine.engine_core import EngineCore

    path = _tiny_checkpoint("LlamaForCausalLM", tmp_path)
    settings = {"device": "cuda", "max_total_tokens": 8192, "chunked_prefill_size": 256,
                "max_num_batched_tokens": 512}  # fmt: skip
    prompts = [*PROMPTS, list(range(5, 905)), [9, 8, 7] * 200]
    runs = {}
    for name, dtype, prefill in [("cudnn", "bfloat16", "cudnn"), ("triton", "bfloat16", "triton"),
                                 ("fp32", "float32", "triton")]:  # fmt: skip
        core = EngineCore(build_engine_config(path, dtype=dtype, prefill_attention_backend=prefill,
                                              **settings))  # fmt: skip
        assert (core.runner.backend.prefill_library is not None) == (name == "cudnn")
        assert core.runner.backend.prefill_attention == ("cudnn" if name == "cudnn" else "triton")
        runs[name] = _first_token_logprobs(core, prompts)
        if name == "cudnn":
            assert core.runner.backend.prefill_library._graphs  # the prompts went through it
        del core
    errors = {"cudnn": [], "triton": []}
    for cudnn, triton, exact in zip(*runs.values(), strict=True):
        ref = torch.tensor([lp for _, lp in exact.top])
        for name, run in (("cudnn", cudnn), ("triton", triton)):
            errors[name].append((torch.tensor([lp for _, lp in run.top]) - ref).abs().max().item())
        # bf16 logits of this wide model are coarse (0.1-0.5 apart in logprob from float32's on
        # either kernel): a token is compared only where float32's margin exceeds that
        worst = max(errors["cudnn"][-1], errors["triton"][-1])
        if exact.top[0][1] - exact.top[1][1] > 2 * worst + 0.05:
            assert cudnn.token_id == exact.token_id, errors
    mean = {name: sum(e) / len(e) for name, e in errors.items()}
    assert mean["cudnn"] <= 1.5 * mean["triton"] + 0.05, errors
    assert max(errors["cudnn"]) <= 2 * max(errors["triton"]) + 0.1, errors


def test_engine_builds_every_graph_at_start(tmp_path) -> None:  # noqa: ANN001
    """The engine's graphs are built before it is ready, one per batch bucket up to its most
    running requests, for its longest chunk and page table: prompts after start build none."""
    from test_engine_gpu import _tiny_checkpoint

    from kvserve.engine.config_builder import build_engine_config
    from kvserve.engine.core.sampling_params import SamplingParams
    from kvserve.engine.engine_core import EngineCore

    path = _tiny_checkpoint("LlamaForCausalLM", tmp_path)
    core = EngineCore(build_engine_config(
        path, dtype="bfloat16", prefill_attention_backend="cudnn", device="cuda",
        max_total_tokens=16384, max_running_requests=8,
    ))  # fmt: skip
    library = core.runner.backend.prefill_library
    # the activation profile's step builds one too, on its own throw-away pool
    on_pool = [g for g in library._graphs if g.num_pages == core.runner.num_pages]
    assert sorted(g.batch for g in on_pool) == [1, 2, 4, 8]
    assert {(g.max_query, g.table_width) for g in library._graphs} == {(8192, 128)}
    built = len(library.builds)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    for i in range(4):  # one step of four 1500-row chunks: 9M pairs, past MIN_PAIRS
        core.add_request(str(i), [(7 * i + j) % 1000 + 1 for j in range(1500)], params)
    taken, step_inputs = [], library.step_inputs

    def counted(meta, first_seq):  # noqa: ANN001, ANN202
        inputs = step_inputs(meta, first_seq)
        taken.append(inputs is not None)
        return inputs

    library.step_inputs = counted
    while core.has_unfinished():
        core.step()
    assert any(taken)  # the four chunks went to cuDNN
    assert len(library.builds) == built
