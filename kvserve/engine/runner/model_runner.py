"""The model runner: builds the model and its KV cache, turns each batch plan into tensors,
runs the forward pass and samples. Everything tensor-shaped lives here."""

from __future__ import annotations

import dataclasses
import gc
import logging
from collections.abc import Iterable, Sequence

import torch

from kvserve.config import EngineConfig, ModelConfig
from kvserve.distributed.collectives import all_reduce, min_over_ranks
from kvserve.distributed.parallel_state import SINGLE, TPGroup
from kvserve.distributed.plan_channel import PlanChannel
from kvserve.engine.core.request import Request
from kvserve.engine.core.scheduler_output import SchedulerOutput
from kvserve.engine.runner.activation_profile import activation_peak_bytes
from kvserve.engine.runner.cuda_graphs import DecodeGraphs
from kvserve.engine.runner.input_batch import ModelInputs, build_model_inputs, fill_pending_rows
from kvserve.engine.runner.kv_cache_sizing import num_pages_cpu, num_pages_gpu
from kvserve.engine.runner.kv_pool import KVPool, PageGeometry, resolve_kv_dtype
from kvserve.engine.runner.launched_step import LaunchedStep
from kvserve.engine.runner.sampling_batch import build_sampling_batch
from kvserve.engine.runner.tp_step import SampleRow, launch_parallel
from kvserve.engine.runner.warm_start import (
    StartPasses,
    StartReport,
    start_compilers,
    warm_start,
)
from kvserve.errors import ConfigError
from kvserve.kernels._triton import hopper_or_newer
from kvserve.kernels.options import KernelOptions
from kvserve.kv_layout import pages_for
from kvserve.layers.attention import (
    check_kv_cache_dtype_on_device,
    create_attention_backend,
    create_prefill_library,
)
from kvserve.layers.attention.cudnn_prefill import GraphDims
from kvserve.layers.sampler import Sampler, SamplerOutput
from kvserve.models.forward_context import ForwardContext
from kvserve.models.registry import model_class
from kvserve.quant.registry import check_device as check_quant_device
from kvserve.quant.registry import resolve as resolve_quantization

log = logging.getLogger("kvserve.runner")


class ModelRunner:
    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        weights: Iterable[tuple[str, torch.Tensor]] | None,
        device: torch.device,
        dtype: torch.dtype,
        context_length: int,
        tp: TPGroup = SINGLE,
    ) -> None:
        self.config, self.model_config = config, model_config
        self.tp = tp
        # The KV pool holds this rank's KV heads only.
        self.kv_model_config = _local_kv_config(model_config, tp)
        self.plans = PlanChannel(tp) if tp.is_parallel and tp.rank == 0 else None
        self.device, self.dtype = device, dtype
        self.page_size = config.cache.page_size
        kv_dtype = resolve_kv_dtype(config.cache.kv_cache_dtype, dtype)
        pdl = _resolve_pdl(config.enable_pdl, device)
        self.max_pages_per_seq = pages_for(context_length, self.page_size)
        graph_dims = GraphDims.for_engine(config.scheduler, self.max_pages_per_seq)
        prefill = create_prefill_library(
            config.prefill_attention_backend, config.attention_backend, device, dtype, kv_dtype,
            model_config.head_dim, graph_dims,
        )  # fmt: skip
        self.backend = create_attention_backend(config.attention_backend, device, pdl, prefill)
        check_kv_cache_dtype_on_device(kv_dtype, self.backend.name, device)
        warm = device.type == "cuda" and self.backend.name == "triton"
        compilers = start_compilers(tp.size) if warm else None
        # Chosen once: the layers with a Triton kernel run it with the triton backend.
        self.kernels = KernelOptions(triton=self.backend.name == "triton", pdl=pdl)
        quant = resolve_quantization(model_config.quantization, config.quantization)
        cc = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
        check_quant_device(quant, device.type, cc)
        if quant.scheme != "none":
            log.info("quantization: %s (%s)", quant.scheme, quant.source)
        with torch.device(device):
            model_cls = model_class(model_config.architecture)
            sharded = {"tp": tp} if tp.is_parallel else {}
            self.model = model_cls(
                model_config, dtype, context_length, self.kernels, quant, **sharded
            )
        if weights is None:
            self.model.init_dummy_weights(config.seed)
        else:
            self.model.load_weights(weights)
        self.model.eval()
        self.sampler = Sampler()
        self._allocate_kv_pool(context_length, kv_dtype)
        if prefill is not None:  # its batch buckets: up to the running cap, now known
            prefill.dims = GraphDims.for_engine(self.config.scheduler, self.max_pages_per_seq)
        self.graphs: DecodeGraphs | None = None
        if tp.is_parallel and device.type == "cuda":
            # NCCL's communicator must have run once before a CUDA graph captures it.
            all_reduce(torch.zeros(1, device=device), tp)
            torch.cuda.synchronize(device)
        max_bs = self.config.scheduler.running_ceiling
        if config.cuda_graph_max_bs is not None:
            max_bs = min(config.cuda_graph_max_bs, max_bs)
        graphs_wanted = max_bs > 0 and not config.enforce_eager
        self.start_report: StartReport | None = None
        if warm:
            self.graphs, self.start_report = warm_start(
                StartPasses(
                    self.model, self.kv, self.backend, prefill, context_length,
                    self.config.scheduler, max_bs if graphs_wanted else 0, self.max_pages_per_seq,
                    model_config.hidden_size, dtype, device, compilers,
                )
            )  # fmt: skip

    def _allocate_kv_pool(self, context_length: int, kv_dtype: torch.dtype) -> None:
        """The KV pool in the memory left; ``self.config`` then gets the running cap from it if
        the cap was left to the pool (every rank sees the same pages, so the same cap)."""
        pages = self._size_kv_cache(context_length, kv_dtype)
        if pages < 1:  # before the warm-up and graph capture, which read page 0
            raise ConfigError(_no_kv_memory(self.config, self.device))
        geometry = PageGeometry.of(self.kv_model_config, pages, self.page_size)
        self.kv = KVPool.allocate(geometry, kv_dtype, self.device)
        if self.kv.is_fp8:
            for layer, (k_scale, v_scale) in self.model.kv_cache_scales.by_layer.items():
                self.kv.set_scales(layer, k_scale, v_scale)
        self.num_pages = geometry.num_pages
        scheduler = self.config.scheduler.for_pool(self.num_pages * self.page_size)
        self.config = dataclasses.replace(self.config, scheduler=scheduler)
        log.info(
            "KV cache: %d pages x %d tokens = %d tokens (%.2f GB, %s, %d bytes/token)",
            self.num_pages,
            self.page_size,
            self.num_pages * self.page_size,
            self.kv.nbytes / 1e9,
            str(kv_dtype).removeprefix("torch."),
            self.kv.bytes_per_token,
        )

    def release_graphs(self) -> None:
        """Free the captured decode graphs. NCCL will not tear down a communicator while a
        graph that captured it is alive, so this comes before leaving the TP group."""
        if self.graphs is not None:
            self.graphs = None
            gc.collect()

    def send_stop(self) -> None:
        """Tensor-parallel rank 0: tell the other ranks there are no more steps."""
        assert self.plans is not None
        self.plans.send(None)

    def _size_kv_cache(self, context_length: int, kv_dtype: torch.dtype) -> int:
        """Pages this rank can hold; under tensor parallelism the fewest any rank can, so one
        page table serves every rank."""
        pages = self._size_kv_cache_here(context_length, kv_dtype)
        return min_over_ranks(pages, self.tp, self.device)

    def _size_kv_cache_here(self, context_length: int, kv_dtype: torch.dtype) -> int:
        if self.device.type != "cuda":
            return num_pages_cpu(self.config.cache, context_length)
        peak = activation_peak_bytes(
            self.model, self.backend, self.kv_model_config, self.config.scheduler,
            page_size=self.page_size, context_length=context_length, kv_dtype=kv_dtype,
            device=self.device,
        )  # fmt: skip
        return num_pages_gpu(self.config.cache, self.kv_model_config, kv_dtype, self.device, peak)

    @torch.inference_mode()
    def launch(self, plan: SchedulerOutput, in_flight: LaunchedStep | None) -> LaunchedStep:
        """Enqueue one step's forward pass and sampling; returns without waiting for the device.
        ``in_flight`` is the step still running, whose sampled ids feed this step's pending
        rows (overlap scheduling); None when every token is known on the host."""
        if self.plans is not None:  # tensor-parallel rank 0: every rank runs the step
            return launch_parallel(self, plan, in_flight)
        inputs = build_model_inputs(plan, self.page_size, self.device)
        if inputs.pending_rows:
            _fill_pending_rows(inputs, in_flight)
        requests = [plan.chunks[i].request for i in inputs.sampled_chunks]
        out = self.execute(inputs, requests)
        return LaunchedStep.empty(plan) if out is None else LaunchedStep.start(plan, requests, out)

    def execute(
        self, inputs: ModelInputs, rows: Sequence[Request | SampleRow]
    ) -> SamplerOutput | None:
        """Forward pass, logits of the sampled rows and sampling; None when nothing samples."""
        if self.graphs is not None and self.graphs.can_run(inputs):
            hidden = self.graphs.run(inputs)
        else:
            ctx = ForwardContext(inputs.meta, self.kv, self.backend)
            hidden = self.model(inputs.token_ids, inputs.positions, ctx)
        if not inputs.sampled_chunks:
            return None
        logits = self.model.compute_logits(inputs.sampled(hidden))
        batch = build_sampling_batch(rows, logits.shape[1], self.device)  # type: ignore[arg-type]
        return self.sampler(logits, batch)


def _fill_pending_rows(inputs: ModelInputs, in_flight: LaunchedStep | None) -> None:
    """Copy the in-flight step's sampled ids into this step's pending rows, on the device."""
    if in_flight is None or in_flight.token_ids is None:
        raise RuntimeError("a step has pending tokens but no step is in flight")
    row_of = in_flight.row_of()
    src = [row_of[r.request_id] for r in inputs.pending_requests]
    fill_pending_rows(inputs, src, in_flight.token_ids)


def _local_kv_config(model_config: ModelConfig, tp: TPGroup) -> ModelConfig:
    if not tp.is_parallel:
        return model_config
    kv_heads = max(1, model_config.num_kv_heads // tp.size)
    return dataclasses.replace(model_config, num_heads=kv_heads, num_kv_heads=kv_heads)


def _resolve_pdl(setting: bool | None, device: torch.device) -> bool:
    supported = hopper_or_newer(device)
    if setting and not supported:
        raise ConfigError("programmatic dependent launch (enable_pdl) needs an sm_90+ GPU")
    return supported if setting is None else setting


def _no_kv_memory(config: EngineConfig, device: torch.device) -> str:
    """Why a GPU has no KV pages (on CPU the config guarantees one page at least)."""
    free, total = torch.cuda.mem_get_info(device)
    return (
        f"no GPU memory is left for the KV cache: {(total - free) / 2**30:.1f} of "
        f"{total / 2**30:.1f} GiB in use after the weights and a largest step, above "
        f"--mem-fraction-static {config.cache.mem_fraction_static}; raise it, lower "
        "--max-num-batched-tokens, or free the GPU (another process or engine holds memory)"
    )
