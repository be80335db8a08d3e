"""What torch sees: its CUDA build, the GPUs, and whether a tiny kernel really runs."""

from __future__ import annotations

from kvserve.preflight.facts import TorchCudaFacts


def probe_torch() -> TorchCudaFacts:
    try:
        import torch
    except ImportError as exc:
        return TorchCudaFacts(None, reason=f"torch is not installed ({exc})")
    facts = TorchCudaFacts(torch.__version__, torch_cuda=torch.version.cuda)
    if facts.torch_cuda is None:
        facts.reason = "torch is a CPU-only build"
        return facts
    facts.cuda_available = torch.cuda.is_available()
    if not facts.cuda_available:
        facts.reason = "torch.cuda.is_available() is False"
        return facts
    facts.device_count = torch.cuda.device_count()
    facts.capabilities = [torch.cuda.get_device_capability(i) for i in range(facts.device_count)]
    try:
        x = torch.arange(1024, device="cuda", dtype=torch.float32)
        facts.kernel_ok = float((x * 2).sum().item()) == 1023 * 1024.0
        if not facts.kernel_ok:
            facts.kernel_error = "wrong result from x * 2 summed on the GPU"
    except RuntimeError as exc:
        facts.kernel_ok = False
        facts.kernel_error = str(exc).splitlines()[0]
    _probe_prefill_attention(facts)
    return facts


def _probe_prefill_attention(facts: TorchCudaFacts) -> None:
    """The engine's rule (``cudnn_prefill_unavailable``) for a bf16 model with 128-dim heads."""
    import torch

    from kvserve.layers.attention.cudnn_prefill import MISSING_PACKAGE, cudnn_prefill_unavailable

    reason = cudnn_prefill_unavailable(torch.device("cuda:0"), torch.bfloat16, torch.bfloat16, 128)
    if reason is not None:
        facts.prefill_attention, facts.prefill_attention_reason = "triton", reason
        facts.prefill_attention_package_missing = reason == MISSING_PACKAGE
        return
    import cudnn

    facts.prefill_attention = (
        f"cudnn (nvidia-cudnn-frontend {cudnn.__version__}, cuDNN {cudnn.backend_version()})"
    )
