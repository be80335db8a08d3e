"""Facts the probes return: plain data, no judgement. ``None`` means "could not be read"."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GpuDevice:
    index: int
    name: str
    uuid: str = ""
    pci_bus_id: str = ""
    memory_total_mib: int | None = None
    compute_capability: tuple[int, int] | None = None
    persistence_mode: bool | None = None
    ecc_uncorrected: int | None = None  # volatile (since driver load)
    ecc_corrected: int | None = None
    retired_pages_pending: bool | None = None  # pre-Ampere page retirement
    remapped_rows_uncorrectable: int | None = None  # Ampere+ row remapping
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    temperature_c: int | None = None
    temp_slowdown_c: int | None = None
    temp_shutdown_c: int | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    mem_clock_mhz: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    utilization_pct: int | None = None
    clock_event_reasons: int | None = None  # NVML bitmask, decoded by throttle.py
    nvlink_states: list[bool] = field(default_factory=list)  # one per existing link
    fabric_state: str | None = None  # not_supported | not_started | in_progress | completed
    fabric_status: str | None = None  # "success" or NVML's error text


@dataclass
class GpuFacts:
    source: str | None  # "nvml", "nvidia-smi" or None when neither answered
    unavailable_reason: str = ""
    driver_version: str | None = None
    cuda_driver_version: str | None = None  # highest CUDA the driver supports, "13.0"
    devices: list[GpuDevice] = field(default_factory=list)
    visible_devices: str | None = None  # CUDA_VISIBLE_DEVICES, when set
    nvswitch_count: int = 0  # /dev/nvidia-nvswitch* nodes

    @property
    def available(self) -> bool:
        return bool(self.devices)


@dataclass
class XidEvent:
    pci: str
    code: int
    text: str


@dataclass
class KernelLogFacts:
    readable: bool
    reason: str = ""
    xids: list[XidEvent] = field(default_factory=list)


@dataclass
class FabricManagerFacts:
    installed: bool  # the systemd unit or the binary exists
    active_state: str | None = None  # systemd's "active (running)", "failed", ...
    version: str | None = None
    log_errors: list[str] = field(default_factory=list)  # FM's own lines that say it failed
    reason: str = ""


@dataclass
class TorchCudaFacts:
    torch_version: str | None
    torch_cuda: str | None = None  # CUDA torch was built with; None for a CPU build
    cuda_available: bool = False
    device_count: int = 0
    kernel_ok: bool | None = None  # None: not tried
    kernel_error: str = ""
    capabilities: list[tuple[int, int]] = field(default_factory=list)
    reason: str = ""
    # What takes a bf16 model's large prefill steps on GPU 0 (the engine's own choice):
    # "cudnn ..." with versions, or "triton" and why not cuDNN; None: not probed
    prefill_attention: str | None = None
    prefill_attention_reason: str = ""
    prefill_attention_package_missing: bool = False  # the reason is only the missing package


@dataclass
class ModuleFacts:
    readable: bool
    loaded: set[str] = field(default_factory=set)
    reason: str = ""


@dataclass
class IbPort:
    device: str
    port: int
    state: str  # "ACTIVE", "DOWN", "INIT", ...
    phys_state: str  # "LinkUp", "Polling", "Disabled", ...
    rate: str  # "400 Gb/sec (4X NDR)"
    link_layer: str  # "InfiniBand" or "Ethernet" (RoCE)
    link_downed: int | None = None
    link_error_recovery: int | None = None
    symbol_error: int | None = None


@dataclass
class IbDevice:
    name: str
    fw_ver: str | None
    hca_type: str | None
    board_id: str | None
    ports: list[IbPort] = field(default_factory=list)


@dataclass
class IbFacts:
    devices: list[IbDevice] = field(default_factory=list)
    ofed_version: str | None = None  # `ofed_info -s`, None when not installed
    reason: str = ""

    @property
    def present(self) -> bool:
        return bool(self.devices)


@dataclass
class NcclFacts:
    ran: bool
    reason: str = ""
    ok: bool = False
    ranks: int = 0
    nodes: int | None = None
    version: str | None = None
    network: str | None = None  # "IB", "Socket", ... from "Using network X"
    net_devices: list[str] = field(default_factory=list)  # "mlx5_0:1/IB", "eth0"
    transports: list[str] = field(default_factory=list)  # "P2P/CUMEM", "SHM", "NET/IB", ...
    warnings: list[str] = field(default_factory=list)
    size_bytes: int = 0
    time_s: float | None = None  # per all-reduce
    algbw_gbs: float | None = None
    busbw_gbs: float | None = None


@dataclass
class HostFacts:
    shm_bytes: int | None
    nofile_soft: int | None
    memlock_soft: int | None  # -1: unlimited
    thp_enabled: str | None  # the bracketed choice: "always", "madvise" or "never"
    disk_path: str
    disk_free_bytes: int | None
    mem_available_bytes: int | None
    mem_total_bytes: int | None


@dataclass
class ModelFacts:
    path: str
    kind: str | None = None  # "hf" or "gguf"
    problems: list[str] = field(default_factory=list)  # missing/unreadable files
    files: int = 0
    architecture: str | None = None
    num_layers: int | None = None
    num_heads: int | None = None
    num_kv_heads: int | None = None
    hidden_size: int | None = None
    head_dim: int | None = None
    max_context: int | None = None
    dtype: str | None = None  # torch_dtype of the checkpoint, "bfloat16", ...
    quantization: dict[str, object] | None = None  # config.json's quantization_config
    gguf_file_type: str | None = None  # "MOSTLY_Q4_1", ...
    weight_bytes: int | None = None
    # Mixture of experts: bytes of the routed experts' tensors (all held in memory) and how
    # many of ``num_experts`` each token reads.
    expert_bytes: int = 0
    num_experts: int | None = None
    experts_per_token: int | None = None
    expert_intermediate_size: int | None = None

    @property
    def active_weight_bytes(self) -> int | None:
        """Weights one token's forward pass reads: all but the unrouted experts."""
        if self.weight_bytes is None or not self.num_experts or not self.experts_per_token:
            return self.weight_bytes
        unread = self.expert_bytes * (1 - self.experts_per_token / self.num_experts)
        return int(self.weight_bytes - unread)


@dataclass(frozen=True)
class SettingFact:
    """A ``KVSERVE_*`` variable set in preflight's environment."""

    name: str
    value: str  # as printed: a secret's value is not
    problem: str = ""  # why kvserve would refuse it; empty when it is taken
    fatal: bool = True  # the problem stops the engine at load (else it warns and goes on)
    unknown: bool = False  # not a setting kvserve reads (a typo, or one removed)


@dataclass
class NodeFacts:
    gpu: GpuFacts
    kernel_log: KernelLogFacts
    fabric_manager: FabricManagerFacts
    torch: TorchCudaFacts
    modules: ModuleFacts
    ib: IbFacts
    nccl: NcclFacts
    host: HostFacts
    model: ModelFacts | None
    settings: tuple[SettingFact, ...] = ()
