from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import replay_runner

from kvserve.layers.attention.cudnn_prefill import MISSING_PACKAGE
from kvserve.preflight.checks.cuda import check_cuda
from kvserve.preflight.checks.gpu import check_gpus
from kvserve.preflight.checks.thermal import check_thermals
from kvserve.preflight.facts import GpuFacts, KernelLogFacts, TorchCudaFacts
from kvserve.preflight.options import PreflightOptions
from kvserve.preflight.probes.gpu_nvml import facts_from_nvml
from kvserve.preflight.probes.kernel_log import parse_xids, probe_kernel_log
from kvserve.preflight.result import CheckResult, Status


def _gpu(fixtures: Path, name: str) -> GpuFacts:
    return facts_from_nvml(json.loads((fixtures / name).read_text()))


def _by_name(rows: list[CheckResult]) -> dict[str, CheckResult]:
    return {r.name: r for r in rows}


CLEAN_LOG = KernelLogFacts(True)


def test_healthy_hgx_passes_every_gpu_check(fixtures: Path) -> None:
    gpu = _gpu(fixtures, "nvml_hgx_h100_healthy.json")
    rows = check_gpus(gpu, CLEAN_LOG, PreflightOptions(tp=8)) + check_thermals(gpu)
    assert {r.status for r in rows} == {Status.PASS}, [r for r in rows if r.status != Status.PASS]
    pcie = _by_name(rows)["gpu: PCIe link"]
    assert "Gen1 x16" in pcie.observed  # idle GPUs downshift: not a problem


def test_degraded_node_names_each_problem(fixtures: Path) -> None:
    gpu = _gpu(fixtures, "nvml_hgx_h200_degraded.json")
    rows = _by_name(check_gpus(gpu, CLEAN_LOG, PreflightOptions(tp=8)) + check_thermals(gpu))
    assert rows["gpu: persistence mode"].status is Status.WARN
    assert rows["gpu: ECC errors"].status is Status.FAIL
    assert "GPU1: 2 uncorrected" in rows["gpu: ECC errors"].observed
    assert rows["gpu: retired/remapped memory"].status is Status.WARN
    assert "GPU4" in rows["gpu: retired/remapped memory"].observed
    assert rows["gpu: PCIe link"].observed == "GPU5: x8 of x16"
    temp = rows["gpu: temperature"]
    assert temp.status is Status.FAIL and "96 C (GPU2)" in temp.observed
    throttle = rows["gpu: throttle reasons"]
    assert throttle.status is Status.FAIL
    assert "GPU2: SwThermalSlowdown, HwThermalSlowdown" in throttle.observed
    assert "GPU3: SwPowerCap" in throttle.observed
    assert rows["gpu: clocks"].status is Status.WARN
    assert "GPU2 1275/1980 MHz" in rows["gpu: clocks"].observed
    assert all(r.fix for r in rows.values() if r.status in (Status.WARN, Status.FAIL))


@pytest.mark.parametrize(
    ("tp", "visible", "status"),
    [(8, None, "pass"), (16, None, "fail"), (8, "0,1,2,3", "fail"), (4, "0,1,2,3", "pass")],
)
def test_gpu_count_vs_tp(fixtures: Path, tp: int, visible: str | None, status: str) -> None:
    gpu = _gpu(fixtures, "nvml_hgx_h100_healthy.json")
    gpu.visible_devices = visible
    row = _by_name(check_gpus(gpu, CLEAN_LOG, PreflightOptions(tp=tp)))["gpu: count and model"]
    assert row.status.value == status
    assert row.observed.startswith("8 x NVIDIA H100 80GB HBM3")


def test_xids_parse_and_fail_on_fallen_off_bus(fixtures: Path) -> None:
    events = parse_xids((fixtures / "dmesg_xid.txt").read_text())
    assert [(e.pci, e.code) for e in events] == [
        ("0000:3a:00", 13),
        ("0000:3a:00", 43),
        ("0000:9a:00", 79),
    ]
    gpu = _gpu(fixtures, "nvml_hgx_h100_healthy.json")
    log = probe_kernel_log(replay_runner({"dmesg": "dmesg_xid.txt"}))
    row = _by_name(check_gpus(gpu, log, PreflightOptions()))["gpu: Xid errors"]
    assert row.status is Status.FAIL
    assert "Xid 79 x1" in row.observed and "fell off the bus" in row.observed


def test_application_xids_only_warn(fixtures: Path) -> None:
    gpu = _gpu(fixtures, "nvml_hgx_h100_healthy.json")
    log = probe_kernel_log(replay_runner({"dmesg": "dmesg_app_xid.txt"}))
    row = _by_name(check_gpus(gpu, log, PreflightOptions()))["gpu: Xid errors"]
    assert row.status is Status.WARN


def test_unreadable_kernel_log_is_skipped_with_reason(fixtures: Path) -> None:
    log = probe_kernel_log(replay_runner({"dmesg": (1, "ofed_info_s.txt")}))
    gpu = _gpu(fixtures, "nvml_hgx_h100_healthy.json")
    row = _by_name(check_gpus(gpu, log, PreflightOptions()))["gpu: Xid errors"]
    assert row.status is Status.SKIP and "not readable" in row.observed


def _torch(cuda: str | None, cc: tuple[int, int] = (9, 0)) -> TorchCudaFacts:
    return TorchCudaFacts(
        "2.9.0",
        torch_cuda=cuda,
        cuda_available=cuda is not None,
        device_count=8,
        kernel_ok=True if cuda else None,
        capabilities=[cc] * 8,
    )


@pytest.mark.parametrize(
    ("torch_cuda", "status"),
    [("12.4", "pass"), ("12.1", "pass"), ("12.8", "warn"), ("13.0", "fail"), (None, "fail")],
)
def test_driver_cuda_vs_torch_build(fixtures: Path, torch_cuda: str | None, status: str) -> None:
    gpu = _gpu(fixtures, "nvml_hgx_h100_healthy.json")  # driver supports CUDA 12.4
    rows = _by_name(check_cuda(gpu, _torch(torch_cuda), None, PreflightOptions()))
    assert rows["cuda: driver vs torch build"].status.value == status


def test_capability_row_says_which_path_runs(fixtures: Path) -> None:
    gpu = _gpu(fixtures, "nvml_hgx_h100_healthy.json")
    opts = PreflightOptions(quantization="nvfp4")
    row = _by_name(check_cuda(gpu, _torch("12.4"), None, opts))["cuda: capability vs quant"]
    assert row.status is Status.PASS
    assert "sm_90" in row.observed and "nvfp4" in row.observed and "weight-only" in row.observed
    fp8 = _by_name(check_cuda(gpu, _torch("12.4"), None, PreflightOptions(quantization="fp8")))
    assert "FP8 tensor cores" in fp8["cuda: capability vs quant"].observed


@pytest.mark.parametrize(
    ("library", "reason", "status"),
    [
        ("cudnn (nvidia-cudnn-frontend 1.32.0, cuDNN 91900)", "", Status.PASS),
        ("triton", MISSING_PACKAGE, Status.WARN),
        ("triton", "it is enabled on sm_90 (Hopper) only, where it was measured", Status.PASS),
        (None, "", Status.SKIP),
    ],
)
def test_prefill_attention_row_names_the_library(
    fixtures: Path, library: str | None, reason: str, status: Status
) -> None:
    """cuDNN where the engine would take it; a warning only where an sm_90 node lacks the
    package (its long prefills then run about 1.3x slower), with the install as the fix."""
    gpu = _gpu(fixtures, "nvml_hgx_h100_healthy.json")
    torch_facts = _torch("12.4")
    torch_facts.prefill_attention, torch_facts.prefill_attention_reason = library, reason
    torch_facts.prefill_attention_package_missing = reason == MISSING_PACKAGE  # as the probe
    row = _by_name(check_cuda(gpu, torch_facts, None, PreflightOptions()))[
        "cuda: prefill attention"
    ]
    assert row.status is status
    if library == "triton":
        assert row.observed.startswith("the Triton kernel: ") and reason in row.observed
    if status is Status.WARN:
        assert "kvserve[cudnn]" in row.fix


def test_no_gpu_skips_with_the_reason_once() -> None:
    gpu = GpuFacts(source=None, unavailable_reason="no NVIDIA GPU found (nvml: no library)")
    rows = check_gpus(gpu, CLEAN_LOG, PreflightOptions())
    assert all(r.status is Status.SKIP for r in rows)
    assert rows[0].observed == "no NVIDIA GPU found (nvml: no library)"
    assert "see gpu: count and model" in rows[1].observed
