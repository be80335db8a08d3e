"""Model (`--model`): files, architecture, quantization, TP vs heads, context, memory fit."""

from __future__ import annotations

from kvserve.config import SchedulerConfig
from kvserve.models.registry import SUPPORTED_ARCHITECTURES
from kvserve.preflight.capacity import KV_DTYPE_BYTES, MemoryFit, kv_bytes_per_token
from kvserve.preflight.checks.common import GIB, gib
from kvserve.preflight.checks.moe_tiles import check_moe_tiles
from kvserve.preflight.facts import GpuFacts, ModelFacts
from kvserve.preflight.options import PreflightOptions
from kvserve.preflight.quant import scheme_for, supported
from kvserve.preflight.result import CheckResult, Status, skipped

NAMES = (
    "model: files",
    "model: architecture",
    "model: quantization",
    "model: tensor parallel",
    "model: context length",
    "model: memory fit",
)


def check_files(model: ModelFacts) -> CheckResult:
    expected = "config.json + readable safetensors, or a readable .gguf"
    if model.problems:
        fix = "point --model at an HF model directory or a .gguf file; re-download missing shards"
        return CheckResult(NAMES[0], Status.FAIL, "; ".join(model.problems), expected, fix)
    size = gib(model.weight_bytes or 0)
    observed = f"GGUF, {size}" if model.kind == "gguf" else f"{model.files} safetensors, {size}"
    return CheckResult(NAMES[0], Status.PASS, observed, expected)


def check_architecture(model: ModelFacts) -> CheckResult:
    expected = " | ".join(SUPPORTED_ARCHITECTURES)
    if model.architecture in SUPPORTED_ARCHITECTURES:
        return CheckResult(NAMES[1], Status.PASS, model.architecture or "", expected)
    fix = "kvserve has no model class for it yet; serve it with vLLM/SGLang or convert"
    return CheckResult(NAMES[1], Status.FAIL, model.architecture or "none given", expected, fix)


def check_quantization(model: ModelFacts, opts: PreflightOptions) -> CheckResult:
    scheme = scheme_for(model.quantization, model.gguf_file_type, opts.quantization)
    expected = f"a scheme the engine runs: {supported()}"
    if isinstance(scheme, str):
        fix = "serve an unquantized, GGUF or supported quantized checkpoint of the model"
        return CheckResult(NAMES[2], Status.FAIL, scheme, expected, fix)
    return CheckResult(NAMES[2], Status.PASS, f"{scheme.name} ({scheme.source})", expected)


def check_tp(model: ModelFacts, tp: int) -> CheckResult:
    heads = model.num_heads or 1
    kv = model.num_kv_heads or heads
    observed = f"tp {tp}: {heads} attention heads, {kv} KV heads"
    expected = "tp divides attention heads; tp divides KV heads or is a multiple of them"
    bad_kv = kv % tp != 0 and tp % kv != 0
    if heads % tp or bad_kv:
        good = [t for t in (1, 2, 4, 8, 16) if heads % t == 0 and (kv % t == 0 or t % kv == 0)]
        fix = f"use --tp in {good}"
        return CheckResult(NAMES[3], Status.FAIL, observed, expected, fix)
    if kv < tp:
        observed += f" (KV heads replicated x{tp // kv})"
    return CheckResult(NAMES[3], Status.PASS, observed, expected)


def check_context(model: ModelFacts, context: int) -> CheckResult:
    expected = f"<= the model's {model.max_context}"
    if model.max_context and context > model.max_context:
        fix = "lower --context-length, or add rope scaling the model was trained for"
        return CheckResult(NAMES[4], Status.WARN, str(context), expected, fix)
    return CheckResult(NAMES[4], Status.PASS, str(context), expected)


def kv_dtype_bytes(model: ModelFacts, opts: PreflightOptions) -> int:
    if opts.kv_cache_dtype != "auto":
        return KV_DTYPE_BYTES[opts.kv_cache_dtype]
    if str((model.quantization or {}).get("kv_cache_quant_algo", "")).upper() == "FP8":
        return 1
    return KV_DTYPE_BYTES.get(str(model.dtype), 2)


def _gpu_bytes(gpu: GpuFacts, opts: PreflightOptions) -> int | None:
    sizes = [d.memory_total_mib for d in gpu.devices if d.memory_total_mib]
    if sizes:
        return min(sizes) * 2**20
    return None if opts.gpu_memory_gib is None else int(opts.gpu_memory_gib * GIB)


def check_memory(model: ModelFacts, gpu: GpuFacts, opts: PreflightOptions, tp: int) -> CheckResult:
    hidden, heads = model.hidden_size or 0, model.num_heads or 1
    head_dim = model.head_dim or hidden // heads
    per_token = kv_bytes_per_token(
        model.num_layers or 0, model.num_kv_heads or 0, head_dim, kv_dtype_bytes(model, opts), tp
    )
    weights = (model.weight_bytes or 0) // tp
    context = opts.context_length or model.max_context or 4096
    numbers = f"weights {gib(weights)}/rank, KV {per_token / 1024:.1f} KiB/token/rank"
    if model.num_experts and model.active_weight_bytes is not None:
        numbers += (
            f" (mixture of {model.num_experts} experts, {model.experts_per_token} per token: "
            f"{gib(model.active_weight_bytes // tp)}/rank read per token)"
        )
    gpu_bytes = _gpu_bytes(gpu, opts)
    if gpu_bytes is None:
        return skipped(NAMES[5], f"no GPU to size against ({numbers}); pass --gpu-memory-gib")
    fit = MemoryFit(
        gpu_bytes,
        opts.mem_fraction_static,
        weights,
        per_token,
        context,
        opts.max_running_requests or 1,
    )
    observed = (
        f"{numbers}; {fit.concurrency} x {context} tokens = KV {gib(fit.kv_needed)}; "
        f"total {gib(weights + fit.kv_needed)} of {gib(fit.budget)}; "
        f"max concurrency {fit.max_concurrency}"
    )
    if opts.max_running_requests is None:
        cap = SchedulerConfig().for_pool(fit.pool_tokens).max_running_requests
        observed += f"; KV pool about {fit.pool_tokens} tokens, so up to {cap} running requests"
    expected = f"<= {opts.mem_fraction_static} x {gib(gpu_bytes)} per rank"
    if fit.fits:
        return CheckResult(NAMES[5], Status.PASS, observed, expected)
    fix = (
        f"--max-running-requests {fit.max_concurrency}, or raise --tp, use --kv-cache-dtype "
        "fp8_e4m3, shorten --context-length, or raise --mem-fraction-static"
    )
    return CheckResult(NAMES[5], Status.FAIL, observed, expected, fix)


def check_model(
    model: ModelFacts | None, gpu: GpuFacts, opts: PreflightOptions
) -> list[CheckResult]:
    if model is None:
        return [skipped("model", "no --model given")]
    rows = [check_files(model)]
    if model.num_layers is None or model.num_heads is None:
        return rows + [skipped(name, "model config not readable") for name in NAMES[1:]]
    tp = opts.tp or 1
    context = opts.context_length or model.max_context or 4096
    rows += [
        check_architecture(model),
        check_quantization(model, opts),
        check_tp(model, tp),
        check_context(model, context),
        check_memory(model, gpu, opts, tp),
    ]
    if model.num_experts:
        rows.append(check_moe_tiles(model, gpu, tp))
    return rows
