"""GPU facts from NVML (nvidia-ml-py), as a raw NVML-shaped dict and then as ``GpuFacts``.

The raw dict is what tests record: ``read_nvml()`` only calls NVML; ``facts_from_nvml()`` only
converts, so it runs on recorded dicts without a GPU.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

from kvserve.preflight.facts import GpuDevice, GpuFacts

FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}


class NvmlUnavailable(RuntimeError):
    """NVML could not be loaded or initialised (no driver, no GPU, no library)."""


def _try(fn: Callable[..., Any], *args: Any) -> Any:
    """One NVML query; None when this GPU or driver does not support it."""
    import pynvml

    try:
        return fn(*args)
    except pynvml.NVMLError:
        return None


def init_nvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailable(f"nvidia-ml-py is not installed ({exc})") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML init failed: {exc}") from exc
    return pynvml


def read_dynamic(handle: Any) -> dict[str, Any]:
    """The values that change under load; the monitor samples these."""
    import pynvml as nv

    util = _try(nv.nvmlDeviceGetUtilizationRates, handle)
    reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
    reasons_fn = reasons_fn or nv.nvmlDeviceGetCurrentClocksThrottleReasons
    return {
        "temperature": _try(nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU),
        "clock_sm": _try(nv.nvmlDeviceGetClockInfo, handle, nv.NVML_CLOCK_SM),
        "clock_sm_max": _try(nv.nvmlDeviceGetMaxClockInfo, handle, nv.NVML_CLOCK_SM),
        "clock_mem": _try(nv.nvmlDeviceGetClockInfo, handle, nv.NVML_CLOCK_MEM),
        "power_mw": _try(nv.nvmlDeviceGetPowerUsage, handle),
        "power_limit_mw": _try(nv.nvmlDeviceGetEnforcedPowerLimit, handle),
        "utilization_gpu": None if util is None else util.gpu,
        "clock_event_reasons": _try(reasons_fn, handle),
    }


def _fabric(handle: Any) -> dict[str, Any] | None:
    import pynvml as nv

    info = nv.c_nvmlGpuFabricInfo_t()
    if _try(nv.nvmlDeviceGetGpuFabricInfo, handle, ctypes.byref(info)) is None:
        return None
    return {"state": int(info.state), "status": int(info.status)}


def _nvlinks(handle: Any) -> list[int]:
    import pynvml as nv

    states = [
        _try(nv.nvmlDeviceGetNvLinkState, handle, link) for link in range(nv.NVML_NVLINK_MAX_LINKS)
    ]
    return [int(s) for s in states if s is not None]


def _static(nv: Any, handle: Any, index: int) -> dict[str, Any]:
    mem = _try(nv.nvmlDeviceGetMemoryInfo, handle)
    pci = _try(nv.nvmlDeviceGetPciInfo, handle)
    threshold = nv.nvmlDeviceGetTemperatureThreshold
    return {
        "index": index,
        "name": _try(nv.nvmlDeviceGetName, handle),
        "uuid": _try(nv.nvmlDeviceGetUUID, handle),
        "pci_bus_id": None if pci is None else _text(pci.busId),
        "memory_total_bytes": None if mem is None else int(mem.total),
        "cuda_compute_capability": _try(nv.nvmlDeviceGetCudaComputeCapability, handle),
        "persistence_mode": _try(nv.nvmlDeviceGetPersistenceMode, handle),
        "ecc_uncorrected_volatile": _try(
            nv.nvmlDeviceGetTotalEccErrors,
            handle,
            nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nv.NVML_VOLATILE_ECC,
        ),
        "ecc_corrected_volatile": _try(
            nv.nvmlDeviceGetTotalEccErrors,
            handle,
            nv.NVML_MEMORY_ERROR_TYPE_CORRECTED,
            nv.NVML_VOLATILE_ECC,
        ),
        "remapped_rows": _try(nv.nvmlDeviceGetRemappedRows, handle),
        "retired_pages_pending": _try(nv.nvmlDeviceGetRetiredPagesPendingStatus, handle),
        "pcie": {
            "gen": _try(nv.nvmlDeviceGetCurrPcieLinkGeneration, handle),
            "gen_max": _try(nv.nvmlDeviceGetMaxPcieLinkGeneration, handle),
            "width": _try(nv.nvmlDeviceGetCurrPcieLinkWidth, handle),
            "width_max": _try(nv.nvmlDeviceGetMaxPcieLinkWidth, handle),
        },
        "temp_slowdown": _try(threshold, handle, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
        "temp_shutdown": _try(threshold, handle, nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
        "nvlink_state": _nvlinks(handle),
        "fabric": _fabric(handle),
    }


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_nvml() -> dict[str, Any]:
    """Everything preflight needs from NVML, as JSON-able data. Raises ``NvmlUnavailable``."""
    nv = init_nvml()
    try:
        raw: dict[str, Any] = {
            "driver_version": _text(nv.nvmlSystemGetDriverVersion()),
            "cuda_driver_version": _try(nv.nvmlSystemGetCudaDriverVersion),
            "devices": [],
        }
        for index in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            device = _static(nv, handle, index) | read_dynamic(handle)
            device["name"] = _text(device["name"])
            device["uuid"] = _text(device["uuid"])
            raw["devices"].append(device)
        return raw
    finally:
        nv.nvmlShutdown()


def _cuda_version(value: int | None) -> str | None:
    # NVML encodes CUDA 13.0 as 13000
    return None if value is None else f"{value // 1000}.{value % 1000 // 10}"


def _watts(milliwatts: int | None) -> float | None:
    return None if milliwatts is None else milliwatts / 1000.0


def _fabric_fields(fabric: dict[str, Any] | None) -> tuple[str | None, str | None]:
    if fabric is None:
        return None, None
    raw = fabric["status"]  # an nvmlReturn_t from NVML, nvidia-smi's text otherwise
    if raw in (0, "Success"):
        status = "success"
    else:
        status = raw if isinstance(raw, str) else f"NVML error {raw}"
    return FABRIC_STATES.get(fabric["state"], str(fabric["state"])), status


def device_from_nvml(d: dict[str, Any]) -> GpuDevice:
    remap = d.get("remapped_rows") or [None, None, None, None]
    pcie = d.get("pcie") or {}
    fabric_state, fabric_status = _fabric_fields(d.get("fabric"))
    cc = d.get("cuda_compute_capability")
    mem = d.get("memory_total_bytes")
    pending = d.get("retired_pages_pending")
    return GpuDevice(
        index=d["index"],
        name=d.get("name") or "unknown",
        uuid=d.get("uuid") or "",
        pci_bus_id=d.get("pci_bus_id") or "",
        memory_total_mib=None if mem is None else mem // 2**20,
        compute_capability=None if cc is None else (int(cc[0]), int(cc[1])),
        persistence_mode=None if d.get("persistence_mode") is None else bool(d["persistence_mode"]),
        ecc_uncorrected=d.get("ecc_uncorrected_volatile"),
        ecc_corrected=d.get("ecc_corrected_volatile"),
        retired_pages_pending=None if pending is None else bool(pending),
        remapped_rows_uncorrectable=remap[1],
        remap_pending=None if remap[2] is None else bool(remap[2]),
        remap_failure=None if remap[3] is None else bool(remap[3]),
        pcie_gen=pcie.get("gen"),
        pcie_gen_max=pcie.get("gen_max"),
        pcie_width=pcie.get("width"),
        pcie_width_max=pcie.get("width_max"),
        temperature_c=d.get("temperature"),
        temp_slowdown_c=d.get("temp_slowdown"),
        temp_shutdown_c=d.get("temp_shutdown"),
        sm_clock_mhz=d.get("clock_sm"),
        sm_clock_max_mhz=d.get("clock_sm_max"),
        mem_clock_mhz=d.get("clock_mem"),
        power_w=_watts(d.get("power_mw")),
        power_limit_w=_watts(d.get("power_limit_mw")),
        utilization_pct=d.get("utilization_gpu"),
        clock_event_reasons=d.get("clock_event_reasons"),
        nvlink_states=[bool(s) for s in d.get("nvlink_state") or []],
        fabric_state=fabric_state,
        fabric_status=fabric_status,
    )


def facts_from_nvml(raw: dict[str, Any]) -> GpuFacts:
    return GpuFacts(
        source="nvml",
        driver_version=raw.get("driver_version"),
        cuda_driver_version=_cuda_version(raw.get("cuda_driver_version")),
        devices=[device_from_nvml(d) for d in raw.get("devices", [])],
    )
