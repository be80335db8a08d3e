"""What every benchmark shares, in one place.

- Results: benchmarks/results/<name>_<date>.json, stamped with the machine, date and commit so a
  figure can be traced to what produced it.
- Ceilings: the machine's own limits, measured in the run that quotes them (copy bandwidth,
  bf16 matmul rate), and the timing helpers they use.
- Engine driving: an engine on a real architecture with dummy weights, batches of greedy
  requests, decode rates. Benchmarks reach engine internals only through the helpers here, so a
  change inside the engine is followed in this file alone.
"""

from __future__ import annotations

import datetime as dt
import gc
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from kvserve.env_settings import settings_set

if TYPE_CHECKING:
    from kvserve.engine.core.request import Request
    from kvserve.engine.engine_core import EngineCore

RESULTS_DIR = Path(__file__).parent / "results"
LLAMA_8B = "benchmarks/configs/llama-3-8b"  # as recorded in results; run from the repo root


# -- results ---------------------------------------------------------------------------------
def git_commit() -> str:
    """KVSERVE_COMMIT when set (a copy of the tree run elsewhere may carry a stale .git), else
    the checkout's HEAD."""
    if os.environ.get("KVSERVE_COMMIT"):
        return os.environ["KVSERVE_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def tree_env(tree: Path) -> dict[str, str]:
    """The environment of a process that measures the kvserve of another source tree (an
    export or a worktree of an older commit, for an A/B on one machine): the tree first on
    PYTHONPATH (other entries, such as carried wheels, after it; this checkout's root left out)
    and the commit its results are stamped with: the tree's own HEAD where it is a git checkout
    of its own, else ``tree:<its folder's name>``."""
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    extra = [p for p in extra if Path(p).resolve() != Path.cwd().resolve()]
    return {"PYTHONPATH": os.pathsep.join([str(tree), *extra]), "HF_HUB_OFFLINE": "1",
            "KVSERVE_COMMIT": _tree_commit(tree)}  # fmt: skip


def _tree_commit(tree: Path) -> str:
    if tree.resolve() == Path(__file__).resolve().parents[1]:
        return git_commit()  # this checkout: KVSERVE_COMMIT where set, as for any run

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    top = git("rev-parse", "--show-toplevel")
    if top and Path(top).resolve() == tree.resolve():
        return git("rev-parse", "--short", "HEAD")
    return f"tree:{tree.resolve().name}"


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "triton": _installed_version("triton"),  # its compiler sets every Triton kernel's speed
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_memory_GiB"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        info["cuda_runtime"] = torch.version.cuda
    # without it a Hopper engine runs long prefill on the Triton kernel, about 1.3x slower
    info["cudnn_frontend"] = _installed_version("nvidia-cudnn-frontend")
    return info


def _installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


# kvserve's switches as the command line set them (KVSERVE_FP8_MOE_GEMV=1, ...), before a
# benchmark sets its own per part: which side of an A/B a result file is
_SETTINGS_AT_START = settings_set()
# What each engine this run built chose (build_engine), written with every result
_ENGINES_BUILT: list[dict[str, Any]] = []


def stamp(name: str) -> dict[str, Any]:
    return {
        "benchmark": name,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": machine(),
        "kvserve_env_at_start": dict(sorted(_SETTINGS_AT_START.items())),  # the key hidden
        "engines_built": list(_ENGINES_BUILT),
    }


def write_json(path: Path | str, record: dict[str, Any], indent: int = 2) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=indent) + "\n")
    return path


def write_result(name: str, payload: dict[str, Any], out_dir: Path | str | None = None) -> Path:
    """``<out_dir or benchmarks/results>/<name>_<date>.json``: the stamp, then ``payload``.
    Later writes of one run (saves after each part) replace its file; a second run the same day
    writes ``<name>_<date>_2.json`` and so on: a result is evidence a row of INDEX.md may cite,
    never overwritten by another run."""
    directory = Path(out_dir) if out_dir is not None else RESULTS_DIR
    key = (directory.resolve(), name)
    if key not in _RUN_PATHS:
        stem = f"{name}_{dt.date.today().isoformat()}"
        path, copies = directory / f"{stem}.json", 1
        while path.exists():
            copies += 1
            path = directory / f"{stem}_{copies}.json"
        _RUN_PATHS[key] = path
    return write_json(_RUN_PATHS[key], {**stamp(name), **payload})


_RUN_PATHS: dict[tuple[Path, str], Path] = {}  # (directory, name) -> this process's file


# -- ceilings and timing ---------------------------------------------------------------------
def median_ms(fn: Callable[[], object], warmup_ms: int = 25, rep_ms: int = 200) -> float:
    """Median GPU time of ``fn`` after warm-up (Triton's do_bench)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def copy_bandwidth_gbs(device: str = "cuda") -> float:
    """Device-to-device copy, bytes read + written per second (GB/s): 4 GiB on a GPU timed by
    do_bench; 256 MiB on a CPU, five copies after one warm-up."""
    if device != "cpu":
        src = torch.randn(2 * 2**30, dtype=torch.bfloat16, device=device)
        dst = torch.empty_like(src)
        ms = median_ms(lambda: dst.copy_(src))
        return 2 * src.numel() * src.element_size() / ms / 1e6
    x = torch.empty(256 * 1024 * 1024 // 4)
    y = torch.empty_like(x)
    y.copy_(x)
    t = time.perf_counter()
    for _ in range(5):
        y.copy_(x)
    return 5 * 2 * x.numel() * 4 / (time.perf_counter() - t) / 1e9


def matmul_tflops() -> float:
    """bf16 matmul on random 8192^3 operands."""
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    ms = median_ms(lambda: a @ b)
    return 2 * 8192**3 / ms / 1e9


def fp8_matmul_tflops() -> float:
    """e4m3 x e4m3 -> bf16 matmul (``torch._scaled_mm``, per-tensor scales) on 8192^3."""
    a = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn).t()  # column-major
    one = torch.ones((), device="cuda")
    ms = median_ms(lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16))
    return 2 * 8192**3 / ms / 1e9


def gpu_ceilings() -> dict[str, float]:
    """Copy bandwidth and matmul rates; the FP8 rate only where FP8 tensor cores exist (sm_89+)."""
    ceil = {"copy_GBps": copy_bandwidth_gbs(), "bf16_matmul_TFLOPs": matmul_tflops()}
    if torch.cuda.get_device_capability() >= (8, 9):
        ceil["fp8_matmul_TFLOPs"] = fp8_matmul_tflops()
    return ceil


def matmul_ceiling_tflops(ceil: dict[str, float], fp8_tensor_cores: bool) -> float:
    """The matmul ceiling a format's GEMMs run against: FP8 W8A8 on the FP8 tensor cores,
    everything else (weight-only formats included) at bf16's."""
    return ceil["fp8_matmul_TFLOPs"] if fp8_tensor_cores else ceil["bf16_matmul_TFLOPs"]


def graph_replay_ms(graph: torch.cuda.CUDAGraph, replays: int, warmup: int) -> float:
    """Median time of one replay of a captured graph, after ``warmup`` untimed replays."""
    times = []
    for i in range(warmup + replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def captured_ms(fn: Callable[[], object], replays: int = 20, warmup: int = 5) -> float:
    """Median ms of ``fn`` replayed from a CUDA graph (host launches left out); one eager call
    first compiles its kernels."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph_replay_ms(graph, replays, warmup)


def timed_after_warmup(fn: Callable[[], object], warmup: Callable[[], object]) -> float:
    """Seconds ``fn`` takes once ``warmup`` has run (both synchronised on a GPU)."""
    warmup()
    sync_device()
    t = time.perf_counter()
    fn()
    sync_device()
    return time.perf_counter() - t


def sync_device() -> None:
    """Waits for the GPU's queued work before a timer starts; nothing to wait for on a CPU."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# -- driving an engine -----------------------------------------------------------------------
def build_engine(model: str = LLAMA_8B, **settings: Any) -> EngineCore:
    """An engine core on ``model``'s config.json with random bf16 weights on the GPU
    (``settings`` override any of these)."""
    from kvserve.engine.config_builder import build_engine_config
    from kvserve.engine.engine_core import EngineCore

    base = {"load_format": "dummy", "device": "cuda", "dtype": "bfloat16"}
    core = EngineCore(build_engine_config(model, **{**base, **settings}))
    choices = engine_choices(core)
    _ENGINES_BUILT.append(choices)
    print(f"engine: {choices}", flush=True)
    return core


def engine_choices(core: EngineCore) -> dict[str, Any]:
    """The kernels an engine chose where the node decides (a missing package, the device)."""
    backend = core.runner.backend
    return {
        "attention_backend": backend.name,
        "prefill_attention": backend.prefill_attention,
        "pdl": core.runner.kernels.pdl,
    }


def allow_longer_context() -> None:
    """Let an engine take a context length above the model's max_position_embeddings (the
    roofline's 16K prefill point on Llama-3-8B's 8K config): kvserve refuses that unless this
    override, named after SGLang's, is set. Dummy weights, so output quality does not matter."""
    os.environ["KVSERVE_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] = "1"


def release_memory() -> None:
    """Give the GPU memory of dropped engines back (``del`` every reference first): the next
    engine sizes its KV pages from the memory free on the device."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1000, vocab - 1000, (n, length), generator=gen).tolist()


def greedy(max_tokens: int) -> Any:  # noqa: ANN401 - kvserve's SamplingParams, imported lazily
    from kvserve import SamplingParams

    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def add_decode_batch(
    core: EngineCore, batch: int, ctx: int, max_tokens: int, seed: int, min_outputs: int = 0
) -> list[Request]:
    """``batch`` greedy requests of ``ctx`` random prompt tokens (``ignore_eos``), stepped
    until each has ``min_outputs`` tokens."""
    prompts = random_prompts(batch, ctx, core.model_config.vocab_size, seed)
    for i, p in enumerate(prompts):
        core.add_request(f"b{batch}-c{ctx}-s{seed}-{i}", p, greedy(max_tokens))
    reqs = list(core.requests.values())
    while min(r.num_output_tokens for r in reqs) < min_outputs:
        core.step()
    return reqs


def decode_rate(core: EngineCore, batch: int, ctx: int, out_lo: int, out_hi: int) -> dict:
    """Tokens decoded between every request having ``out_lo`` and ``out_hi`` outputs (as vLLM's
    decode figures were taken); the batch runs to its end and the prefix cache is emptied."""
    reqs = add_decode_batch(core, batch, ctx, out_hi, seed=batch * 7 + ctx)
    t_lo = None
    while core.has_unfinished():
        core.step()
        if t_lo is None and min(r.num_output_tokens for r in reqs) >= out_lo:
            sync_device()
            t_lo = time.perf_counter()
    t_hi = time.perf_counter()
    assert t_lo is not None
    reset_prefix_cache(core)
    step_s = (t_hi - t_lo) / (out_hi - out_lo)
    return {"tok_s": batch * (out_hi - out_lo) / (t_hi - t_lo), "step_ms": step_s * 1e3}


def drain(core: EngineCore) -> int:
    """Step until every request is done; the number of output tokens produced meanwhile."""
    produced = 0
    while core.has_unfinished():
        produced += sum(len(o.new_token_ids) for o in core.step())
    return produced


# -- engine internals: the one place benchmarks reach into the engine ------------------------
def model_parameters(core: EngineCore) -> list[tuple[str, torch.Tensor]]:
    return list(core.runner.model.named_parameters())


def weight_bytes(core: EngineCore) -> int:
    return sum(p.numel() * p.element_size() for _, p in model_parameters(core))


def _lookup_only_embedding(core: EngineCore) -> torch.Tensor | None:
    """The input embedding table when the output head is not tied to it: a token reads one row
    of it and multiplies by none of it. (Llama-3-8B's is 1.05 GB, a sixth of the NVFP4 model.)"""
    model = core.runner.model
    return None if model.lm_head.tied is not None else model.model.embed_tokens.weight


def _head_params(core: EngineCore) -> int:
    head = core.runner.model.lm_head
    return (head.tied.weight if head.tied is not None else head.weight).numel()


def step_weight_bytes(core: EngineCore) -> int:
    """Weight bytes one decode step reads: every parameter but a lookup-only embedding table."""
    lookup = _lookup_only_embedding(core)
    return weight_bytes(core) - (0 if lookup is None else lookup.numel() * lookup.element_size())


def matmul_params(core: EngineCore) -> int:
    """Weights a sampled token's forward pass multiplies by, counted as values whatever their
    storage (an FP4 byte holds two; block scales are not weights): every linear layer's in x out
    features, each mixture-of-experts layer's router and its top-k experts' three matrices, and
    the output head."""
    from kvserve.layers.linear import Linear
    from kvserve.layers.moe import SparseMoE

    total = _head_params(core)
    for m in core.runner.model.modules():
        if isinstance(m, Linear):
            total += m.in_features * m.out_features
        elif isinstance(m, SparseMoE):
            expert = 3 * m.hidden_size * m.cfg.expert_intermediate_size  # gate, up, down
            total += m.gate.weight.numel() + m.cfg.top_k * expert
    return total


def prefill_matmul_flops(core: EngineCore, length: int) -> float:
    """Matmul FLOPs of one prompt of ``length`` tokens: each token through the layers, the
    output head for the last one only (the engine computes logits for sampled rows only)."""
    head = _head_params(core)
    return 2 * (matmul_params(core) - head) * length + 2 * head


def prefill_flops(core: EngineCore, length: int) -> float:
    """``prefill_matmul_flops`` plus causal attention: QK^T and PV over the keys each row sees."""
    cfg = core.model_config
    attn = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * length * (length + 1) / 2
    return prefill_matmul_flops(core, length) + attn


def kv_bytes_per_token(core: EngineCore) -> int:
    """K and V of one token over all layers, in the KV pool's dtype."""
    return core.runner.kv.bytes_per_token


def kv_pages(core: EngineCore) -> int:
    return core.kv.num_pages


def kv_capacity_tokens(core: EngineCore) -> int:
    return core.kv.num_pages * core.kv.page_size


def reset_prefix_cache(core: EngineCore) -> None:
    core.kv.reset_prefix_cache()


def decode_graphs(core: EngineCore) -> Any:  # noqa: ANN401 - DecodeGraphs or None
    return core.runner.graphs


def max_running_requests(core: EngineCore) -> int:
    return core.scheduler.config.max_running_requests


def preemptions(core: EngineCore) -> int:
    return core.scheduler.counters.preemptions


def reference_model(path: str, dtype: str = "float32") -> Any:  # noqa: ANN401 - transformers
    """The transformers model for an HF directory or GGUF file."""
    import transformers

    kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype)}
    if path.endswith(".gguf"):
        path, kwargs["gguf_file"] = os.path.split(path)
    return transformers.AutoModelForCausalLM.from_pretrained(path, **kwargs).eval()
