"""Configuration: one frozen dataclass tree, validated once in ``__post_init__``.

``ModelConfig`` is the model's shape normalised from an HF ``config.json`` or GGUF metadata
(see ``kvserve.loader.model_config``); the others are engine settings that CLI flags map onto.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from kvserve.errors import ConfigError
from kvserve.kv_layout import check_kv_cache_dtype

DTYPES = ("auto", "float32", "bfloat16", "float16")
# The running cap when none is given: the pool's tokens / AUTO_TOKENS_PER_REQUEST (requests of
# a 1K prompt and a 1K answer), never below the fixed 256 it replaced nor above vLLM's 1024 for
# GPUs of 70 GB and more.
AUTO_TOKENS_PER_REQUEST = 2048
AUTO_MIN_RUNNING = 256
AUTO_MAX_RUNNING = 1024
AUTO_RUNNING_STEP = 16  # kvserve.engine.runner.cuda_graphs captures every 16th batch size
# Set to 1 to serve a context longer than the model was trained for (SGLang's
# SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN): output quality past that length is not assured.
ALLOW_LONGER_CONTEXT_ENV = "KVSERVE_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"

log = logging.getLogger("kvserve.config")


def auto_dtype(device_type: str) -> str:
    """The model dtype ``dtype="auto"`` means on a device type."""
    return "bfloat16" if device_type == "cuda" else "float32"


def env_switch(name: str, default: bool) -> bool:
    """A 0/1 setting from environment variable ``name`` (``default`` when it is unset); any
    other value is refused with one line."""
    value = os.environ.get(name, "1" if default else "0")
    if value not in ("0", "1"):
        raise ConfigError(f"{name}={value!r}: expected 0 or 1")
    return value == "1"


@dataclass(frozen=True)
class MoEConfig:
    """Mixture-of-experts feed-forward: which layers are sparse and how tokens are routed."""

    num_experts: int
    top_k: int  # experts per token
    expert_intermediate_size: int
    # "softmax": softmax over router logits, top-k (Qwen3-MoE, Mixtral).
    # "grouped_sigmoid": sigmoid scores + a correction bias for the choice, top-k within the
    # best `topk_groups` of `num_groups` expert groups (GLM-4.5, DeepSeek-V3).
    scoring: str = "softmax"
    norm_topk_prob: bool = True
    num_groups: int = 1
    topk_groups: int = 1
    routed_scaling_factor: float = 1.0
    shared_expert_intermediate_size: int = 0  # 0: no shared expert
    dense_layers: tuple[int, ...] = ()  # layers with a dense MLP instead of experts

    def __post_init__(self) -> None:
        if not 0 < self.top_k <= self.num_experts:
            raise ConfigError(
                f"model config: experts per token ({self.top_k}) must be in "
                f"1..{self.num_experts} (the number of experts)"
            )
        if self.scoring not in ("softmax", "grouped_sigmoid"):
            raise ConfigError(f"model config: unknown expert scoring {self.scoring!r}")
        if self.num_experts % self.num_groups or not 0 < self.topk_groups <= self.num_groups:
            raise ConfigError(
                f"model config: {self.num_experts} experts cannot be split into "
                f"{self.num_groups} groups with {self.topk_groups} chosen"
            )

    def is_sparse(self, layer: int) -> bool:
        return layer not in self.dense_layers

    @property
    def shared_expert_fits_stacks(self) -> bool:
        """A shared expert of the routed experts' size, which a layer can hold as one more
        expert of its stacks (``kvserve.layers.moe``)."""
        return self.shared_expert_intermediate_size == self.expert_intermediate_size


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a decoder-only transformer, independent of the file format it came from."""

    architecture: str  # HF `architectures[0]`, e.g. "LlamaForCausalLM"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2)
    qk_norm: bool = False  # RMSNorm over each head of q and k (Qwen3)
    hidden_act: str = "silu"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    quantization: dict[str, Any] | None = None  # checkpoint's quantization_config, if any
    moe: MoEConfig | None = None  # None: a dense model
    rotary_dim: int | None = None  # leading head dims that rotary turns (None: all, GLM: half)
    # attention over the last N positions in some or all layers (Mistral's ``sliding_window``);
    # kvserve computes full attention, the same as the window's up to N tokens of context
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        positive = (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(
                    f"model config: {name} must be positive, got {getattr(self, name)}"
                )
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"model config: num_heads ({self.num_heads}) is not a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


@dataclass(frozen=True)
class CacheConfig:
    page_size: int = 16  # tokens per KV page
    # CPU: KV memory is sized from this token budget. GPU: from mem_fraction_static unless set.
    max_total_tokens: int | None = None
    mem_fraction_static: float = 0.88  # share of GPU memory for weights + KV cache
    enable_prefix_cache: bool = True
    kv_cache_dtype: str = "auto"  # "auto" = the model dtype

    def __post_init__(self) -> None:
        if self.page_size <= 0 or self.page_size & (self.page_size - 1):
            raise ConfigError(f"page_size must be a positive power of two, got {self.page_size}")
        if self.max_total_tokens is not None and self.max_total_tokens < self.page_size:
            raise ConfigError(
                f"max_total_tokens ({self.max_total_tokens}) must hold at least one page "
                f"({self.page_size} tokens)"
            )
        if not 0.0 < self.mem_fraction_static < 1.0:
            raise ConfigError(
                f"mem_fraction_static must be in (0, 1), got {self.mem_fraction_static}"
            )
        check_kv_cache_dtype(self.kv_cache_dtype, None)


@dataclass(frozen=True)
class SchedulerConfig:
    # None: from the KV pool once it is sized (``for_pool``): as many requests as it holds at
    # AUTO_TOKENS_PER_REQUEST tokens each, within [AUTO_MIN_RUNNING, AUTO_MAX_RUNNING].
    max_running_requests: int | None = None
    max_num_batched_tokens: int = 8192  # token budget of one step (prefill chunks + decodes)
    chunked_prefill_size: int = 8192  # most prompt tokens one request may prefill in a step
    # ... while other requests decode or wait: a decode's time per token is the step's time, and
    # a waiting request is admitted in what the step's budget has left. On the H200 a
    # 32K / 130K prompt alone prefilled at 87% / 84% of its FLOP floor in 8K chunks, 85% / 81%
    # in 2K ones; beside a 130K prefill in 2K chunks 16 short requests took 180 ms a token.
    prefill_chunk_while_decoding: int = 2048
    max_queued_requests: int | None = None  # waiting-queue bound (None = unbounded)
    # While other requests decode, a prefill chunk ending at context c gets at most
    # chunk_attention_budget / c tokens (never fewer than MIN_CAPPED_CHUNK). 0, the default: off.
    # On the H200 with 2048 x 16384 the short requests beside a 130K prefill went from 209 to
    # 126 ms per token but the prefill from 13.6 to 33.4 s: the prefill attention kernel does
    # not split the context, so a short chunk at long context leaves most SMs idle.
    chunk_attention_budget: int = 0
    # Admission keeps room for the running requests' expected future output (SGLang's
    # new_token_ratio rule, engine.core.future_tokens): 1 is the default, higher keeps more
    # room (fewer preemptions, smaller batches), 0 admits on known tokens alone.
    schedule_conservativeness: float = 1.0

    def __post_init__(self) -> None:
        names = ("max_num_batched_tokens", "chunked_prefill_size", "prefill_chunk_while_decoding")
        if self.max_running_requests is not None:
            names = ("max_running_requests", *names)
        for name in names:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.chunk_attention_budget < 0:
            raise ConfigError(
                f"chunk_attention_budget must be >= 0, got {self.chunk_attention_budget}"
            )
        if self.schedule_conservativeness < 0:
            raise ConfigError(
                f"schedule_conservativeness must be >= 0, got {self.schedule_conservativeness}"
            )
        cap = self.max_running_requests
        if cap is not None and self.max_num_batched_tokens < cap:
            # Every running request must be able to decode one token in the same step.
            object.__setattr__(self, "max_num_batched_tokens", cap)

    @property
    def running_ceiling(self) -> int:
        """Most running requests this config can come to: the cap, or before the pool is sized
        the most ``for_pool`` could pick (what buffers sized ahead of the pool must hold)."""
        if self.max_running_requests is not None:
            return self.max_running_requests
        return min(AUTO_MAX_RUNNING, self.max_num_batched_tokens)

    def for_pool(self, pool_tokens: int) -> SchedulerConfig:
        """This config with the running cap set: from a pool of ``pool_tokens`` if unset."""
        if self.max_running_requests is not None:
            return self
        # A multiple of the graph sizes' step: no odd-sized graph at the top, and the same cap
        # (so the same start signature, start_manifest) while the pool moves by a few pages.
        by_pool = pool_tokens // AUTO_TOKENS_PER_REQUEST // AUTO_RUNNING_STEP * AUTO_RUNNING_STEP
        by_pool = max(AUTO_MIN_RUNNING, by_pool)
        return dataclasses.replace(self, max_running_requests=min(self.running_ceiling, by_pool))

    @property
    def longest_chunk(self) -> int:
        """Most prompt tokens of one request in a step."""
        return min(self.chunked_prefill_size, self.max_num_batched_tokens)

    @property
    def most_chunks(self) -> int:
        """Most requests with tokens in a step."""
        return min(self.running_ceiling, self.max_num_batched_tokens)


DISAGGREGATION_MODES = ("null", "prefill", "decode")
TRANSFER_BACKENDS = ("auto", "mooncake", "nixl", "tcp")


@dataclass(frozen=True)
class DisaggConfig:
    """Prefill/decode disaggregation (SGLang's flag names): a prefill engine computes prompts
    and hands their KV pages out from its bootstrap port; a decode engine fetches them."""

    disaggregation_mode: str = "null"  # null: a normal engine
    disaggregation_bootstrap_host: str = "127.0.0.1"  # where decode engines reach this one
    disaggregation_bootstrap_port: int = 8998
    disaggregation_transfer_backend: str = "auto"  # auto: the first of TRANSFER_BACKENDS that runs
    disaggregation_transfer_timeout: float = 60.0  # seconds a transfer (or held KV) may take
    disaggregation_staging_gb: float = 8.0  # reused (pinned on CUDA) host buffers per worker

    def __post_init__(self) -> None:
        if self.disaggregation_mode not in DISAGGREGATION_MODES:
            modes = ", ".join(DISAGGREGATION_MODES)
            raise ConfigError(f"--disaggregation-mode must be one of {modes}")
        if self.disaggregation_transfer_backend not in TRANSFER_BACKENDS:
            raise ConfigError(
                "--disaggregation-transfer-backend must be one of " + ", ".join(TRANSFER_BACKENDS)
            )
        if not 0 < self.disaggregation_bootstrap_port < 65536:
            raise ConfigError("--disaggregation-bootstrap-port must be in 1..65535")
        if self.disaggregation_transfer_timeout <= 0:
            raise ConfigError("--disaggregation-transfer-timeout must be > 0")
        if self.disaggregation_staging_gb < 0:
            raise ConfigError("--disaggregation-staging-gb must be >= 0")


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine core needs. ``model`` None means the bundled SmolLM2 GGUF."""

    model: str | None = None
    dtype: str = "auto"
    device: str = "auto"  # "auto" = cuda if available, else cpu
    seed: int = 0
    tp: int = 1  # tensor-parallel ranks (one process each; rank 0 runs the scheduler)
    nnodes: int = 1  # hosts the tp ranks span (tp // nnodes ranks, i.e. GPUs, on each)
    node_rank: int = 0  # this host's index; host 0 runs the scheduler and the API
    dist_init_addr: str | None = None  # host:port of rank 0's rendezvous (needed when nnodes > 1)
    context_length: int | None = None  # None = the model's max_position_embeddings
    attention_backend: str = "auto"  # "torch" everywhere; "triton" on GPU
    # The triton backend's prefill: "triton" (its kernel), "cudnn" (cuDNN's paged SDPA for large
    # steps), "auto" (cudnn where it can run: kvserve.layers.attention.cudnn_prefill)
    prefill_attention_backend: str = "auto"
    load_format: str = "auto"  # "auto" or "dummy" (random weights from config.json)
    # None/"auto": the checkpoint's own; a scheme name on an unquantized checkpoint quantizes it
    # at load (online); kvserve.quant.registry lists the schemes.
    quantization: str | None = None
    enforce_eager: bool = False
    # Decode batches up to this replay CUDA graphs, larger ones run eagerly. None: every batch
    # the scheduler can form (max_running_requests); 0: no graphs.
    cuda_graph_max_bs: int | None = None
    # Plan and launch step N+1 before step N's tokens reach the host (None: on for CUDA, where
    # the host work then hides behind the GPU's; off on CPU, where nothing runs concurrently).
    overlap_schedule: bool | None = None
    # Programmatic dependent launch of the Triton kernels (None: on where it exists, sm_90+).
    enable_pdl: bool | None = None
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    disagg: DisaggConfig = field(default_factory=DisaggConfig)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ConfigError(f"device must be auto, cpu or cuda[:N], got {self.device!r}")
        if self.attention_backend not in ("auto", "torch", "triton"):
            raise ConfigError(f"unknown attention backend {self.attention_backend!r}")
        if self.prefill_attention_backend not in ("auto", "triton", "cudnn"):
            raise ConfigError(
                f"unknown prefill attention backend {self.prefill_attention_backend!r}"
            )
        if self.load_format not in ("auto", "dummy"):
            raise ConfigError(f"load_format must be auto or dummy, got {self.load_format!r}")
        from kvserve.quant.registry import check_flag

        check_flag(self.quantization)
        if self.context_length is not None and self.context_length <= 0:
            raise ConfigError(f"context_length must be positive, got {self.context_length}")
        check_parallel(self.tp, self.nnodes, self.node_rank, self.dist_init_addr)
        check_kv_cache_dtype(self.cache.kv_cache_dtype, self.model_dtype)

    @property
    def model_dtype(self) -> str | None:
        """The model dtype's name, where the config alone decides it (None: it depends on
        whether a GPU is present)."""
        if self.dtype != "auto":
            return self.dtype
        return None if self.device == "auto" else auto_dtype(self.device.split(":")[0])


def check_parallel(tp: int, nnodes: int, node_rank: int, dist_init_addr: str | None) -> None:
    if tp < 1:
        raise ConfigError(f"tp (tensor-parallel size) must be at least 1, got {tp}")
    if nnodes < 1 or tp % nnodes:
        raise ConfigError(f"nnodes {nnodes} must be at least 1 and divide tp {tp}")
    if not 0 <= node_rank < nnodes:
        raise ConfigError(f"node_rank {node_rank} must be in 0..{nnodes - 1}")
    if nnodes > 1 and not dist_init_addr:
        raise ConfigError("nnodes > 1 needs dist_init_addr (host:port of node 0's rendezvous)")
    if dist_init_addr is not None:
        host, _, port = dist_init_addr.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"dist_init_addr must be host:port, got {dist_init_addr!r}")


def rope_max_positions(model: ModelConfig) -> int:
    """Longest context the model's rope scaling covers (vLLM's rule: linear, dynamic and yarn
    multiply the trained length by ``factor``; llama3 configs already state the scaled length)."""
    scaling = model.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    factor = scaling.get("factor")
    if kind not in ("linear", "dynamic", "yarn") or not factor:
        return model.max_position_embeddings
    base = scaling.get("original_max_position_embeddings") if kind == "yarn" else None
    return int((base or model.max_position_embeddings) * factor)


def allow_longer_context() -> bool:
    """``KVSERVE_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN``: 1 or true (as vLLM's own variable takes),
    0, false or unset; anything else is refused."""
    value = os.environ.get(ALLOW_LONGER_CONTEXT_ENV, "")
    if value.strip().lower() not in ("", "0", "1", "false", "true"):
        raise ConfigError(f"{ALLOW_LONGER_CONTEXT_ENV}={value!r}: expected 0, 1, false or true")
    return value.strip().lower() in ("1", "true")


def check_context_length(requested: int | None, model: ModelConfig) -> int:
    """The context length to serve: ``requested``, or the model's own when None. Longer than
    the model's (``max_position_embeddings``, or what its rope scaling covers) is refused unless
    ``KVSERVE_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1``. A model with a sliding attention window
    of W tokens is served W at most: kvserve has no windowed attention, and full attention is
    the window's while every key is inside it (a query at position i sees keys i - W + 1 .. i).
    Its own length is cut to W with a warning; a longer ``requested`` is always refused."""
    limit = max(model.max_position_embeddings, rope_max_positions(model))
    window = model.sliding_window
    if requested is None:
        return _cut_to_window(model.max_position_embeddings, window)
    if window is not None and requested > window:
        raise ConfigError(
            f"context_length {requested} is longer than the model's sliding attention window "
            f"of {window} tokens: kvserve computes full attention, which is the model's only "
            f"within the window; lower --context-length to {window} or less"
        )
    if requested <= limit:
        return requested
    if allow_longer_context():
        log.warning(
            "context length %d exceeds the model's %d (%s is set): quality past %d tokens is "
            "not assured", requested, limit, ALLOW_LONGER_CONTEXT_ENV, limit,
        )  # fmt: skip
        return requested
    source = "with its rope scaling" if limit > model.max_position_embeddings else "trained for"
    raise ConfigError(
        f"context_length {requested} is longer than the model's {limit} tokens "
        f"(max_position_embeddings {source}); lower --context-length, or set "
        f"{ALLOW_LONGER_CONTEXT_ENV}=1 to serve it anyway"
    )


def _cut_to_window(length: int, window: int | None) -> int:
    if window is None or length <= window:
        return length
    log.warning(
        "the model attends over a sliding window of %d tokens, which kvserve does not "
        "implement: serving %d tokens of context (not %d), where full attention is the same",
        window, window, length,
    )  # fmt: skip
    return window
