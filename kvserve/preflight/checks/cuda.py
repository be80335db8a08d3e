"""CUDA: the driver's CUDA vs torch's build, torch sees the GPUs and runs a kernel, the GPUs'
compute capability vs what the chosen quantization needs, and which library takes prefill
attention."""

from __future__ import annotations

from kvserve.preflight.checks.common import gpu_skips
from kvserve.preflight.facts import GpuFacts, ModelFacts, TorchCudaFacts
from kvserve.preflight.options import PreflightOptions
from kvserve.preflight.quant import execution_path, paths_on, scheme_for
from kvserve.preflight.result import CheckResult, Status, skipped

NAMES = (
    "cuda: driver vs torch build",
    "cuda: torch sees the GPUs",
    "cuda: test kernel",
    "cuda: capability vs quant",
    "cuda: prefill attention",
)


def _version(text: str | None) -> tuple[int, int] | None:
    try:
        major, minor = (text or "").split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


def check_versions(gpu: GpuFacts, torch: TorchCudaFacts) -> CheckResult:
    expected = f"torch's CUDA <= driver's CUDA {gpu.cuda_driver_version}"
    if torch.torch_version is None:
        return CheckResult(NAMES[0], Status.FAIL, torch.reason, expected, "pip install torch")
    if torch.torch_cuda is None:
        observed = f"torch {torch.torch_version} is a CPU-only build"
        fix = "install a CUDA build, e.g. pip install torch --index-url https://download.pytorch.org/whl/cu130"
        return CheckResult(NAMES[0], Status.FAIL, observed, expected, fix)
    built, driver = _version(torch.torch_cuda), _version(gpu.cuda_driver_version)
    observed = f"torch {torch.torch_version} built with CUDA {torch.torch_cuda}"
    if built is None or driver is None or built <= driver:
        return CheckResult(NAMES[0], Status.PASS, observed, expected)
    fix = (
        f"upgrade the driver to one supporting CUDA {torch.torch_cuda}, or install torch "
        f"built for CUDA <= {gpu.cuda_driver_version}"
    )
    # within one major version CUDA's minor-version compatibility mostly works (not PTX JIT)
    status = Status.FAIL if built[0] > driver[0] else Status.WARN
    return CheckResult(NAMES[0], status, observed, expected, fix)


def check_torch_sees(gpu: GpuFacts, torch: TorchCudaFacts) -> CheckResult:
    expected = f"{len(gpu.devices)} GPUs (NVML's count, less CUDA_VISIBLE_DEVICES)"
    if not torch.cuda_available:
        fix = "check the driver/toolkit pairing and that /dev/nvidia* are visible in the container"
        return CheckResult(NAMES[1], Status.FAIL, torch.reason or "not available", expected, fix)
    return CheckResult(NAMES[1], Status.PASS, f"{torch.device_count} GPUs", expected)


def check_kernel(torch: TorchCudaFacts) -> CheckResult:
    if torch.kernel_ok is None:
        return skipped(NAMES[2], torch.reason or "not tried")
    if not torch.kernel_ok:
        fix = "torch has no kernels for this GPU (wrong arch list?) or the driver is broken"
        return CheckResult(NAMES[2], Status.FAIL, torch.kernel_error, "runs, right result", fix)
    return CheckResult(NAMES[2], Status.PASS, "x*2 summed on GPU: correct", "runs, right result")


def check_capability(
    gpu: GpuFacts, model: ModelFacts | None, opts: PreflightOptions
) -> CheckResult:
    qc = model.quantization if model else None
    gguf_type = model.gguf_file_type if model else None
    scheme = scheme_for(qc, gguf_type, opts.quantization)
    if isinstance(scheme, str):
        return skipped(NAMES[3], scheme)
    ccs = [d.compute_capability for d in gpu.devices if d.compute_capability]
    if not ccs:
        return skipped(NAMES[3], "compute capability not reported")
    cc = min(ccs)
    path = execution_path(scheme, cc)
    observed = f"sm_{cc[0]}{cc[1]}, {scheme.name} ({scheme.source})"
    expected = f"a path on sm_{cc[0]}{cc[1]}: {paths_on(cc)}"
    if path is None:
        fix = f"{scheme.name} cannot run on sm_{cc[0]}{cc[1]}: use a newer GPU or a format listed"
        return CheckResult(NAMES[3], Status.FAIL, observed, expected, fix)
    return CheckResult(NAMES[3], Status.PASS, f"{observed}: {path}", expected)


def check_prefill_attention(torch: TorchCudaFacts) -> CheckResult:
    """Which library takes large prefill steps. Without ``nvidia-cudnn-frontend`` an sm_90 node
    runs them on the Triton kernel, about 1.3x slower at long context: a warning, not a fault."""
    expected = "cuDNN's paged SDPA on sm_90 (else the Triton kernel)"
    if torch.prefill_attention is None:
        return skipped(NAMES[4], torch.reason or "not probed")
    if torch.prefill_attention.startswith("cudnn"):
        return CheckResult(NAMES[4], Status.PASS, torch.prefill_attention, expected)
    observed = f"the Triton kernel: {torch.prefill_attention_reason}"
    if torch.prefill_attention_package_missing:
        fix = "pip install 'kvserve[cudnn]' (nvidia-cudnn-frontend)"
        return CheckResult(NAMES[4], Status.WARN, observed, expected, fix)
    return CheckResult(NAMES[4], Status.PASS, observed, expected)


def check_cuda(
    gpu: GpuFacts, torch: TorchCudaFacts, model: ModelFacts | None, opts: PreflightOptions
) -> list[CheckResult]:
    skips = gpu_skips(gpu, NAMES)
    if skips is not None:
        return skips
    return [
        check_versions(gpu, torch),
        check_torch_sees(gpu, torch),
        check_kernel(torch),
        check_capability(gpu, model, opts),
        check_prefill_attention(torch),
    ]
