"""A sparse mixture-of-experts feed-forward block: a router picks each token's top-k experts,
their SwiGLU MLPs run (``kvserve.kernels.fused_moe*``), and an optional shared expert (a dense
MLP every token goes through, GLM-4.5) is added.

A shared expert of the routed experts' size and format joins their stacks as expert E
(``shared_expert``): the router gives every token one more slot, on it, with weight 1.0, and the
experts' kernels run it with the others. At decode that spares its own three or four launches
(gate/up, SiLU-mul, down, and their activation quantizations) and, under tensor parallelism, its
all-reduce. Otherwise (``KVSERVE_SHARED_EXPERT_FUSION=0``, another size, or a checkpoint that
leaves it unquantized) it is its own dense MLP (``shared_experts``).

Parameter names follow the HF checkpoints: ``gate.weight`` (router, [E, H]),
``gate.e_score_correction_bias`` ([E], grouped-sigmoid routers), ``shared_experts.*``. The
experts are stacked (``w13`` [E, 2I, ...] gate then up rows, ``w2`` [E, H, ...]) in the format
of the layer's expert method (``kvserve.quant.moe_method``: the model dtype, FP8, NVFP4,
MXFP4), which also reads each checkpoint tensor ``experts.{e}.{proj}.{name}`` into them.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from torch import nn

from kvserve.config import MoEConfig, env_switch
from kvserve.distributed.collectives import all_reduce
from kvserve.distributed.parallel_state import SINGLE, TPGroup
from kvserve.distributed.sharding import column_shard, row_shard
from kvserve.kernels.l2_warm import shared_expert_warm
from kvserve.kernels.options import TORCH_REFERENCE, KernelOptions
from kvserve.layers.moe_router import normed_route, route
from kvserve.layers.norm import RMSNorm
from kvserve.quant.moe_method import EXPERT_SHARDS, ExpertMethod, load_rows, projection_rows
from kvserve.quant.moe_unquantized import UnquantizedExpertMethod

SHARED_EXPERT_FUSION_ENV = "KVSERVE_SHARED_EXPERT_FUSION"


def shared_expert_fusion() -> bool:
    """``KVSERVE_SHARED_EXPERT_FUSION``: 1 (the default) stacks a shared expert that can be
    stacked; 0 keeps it a separate MLP (for A/B runs)."""
    return env_switch(SHARED_EXPERT_FUSION_ENV, default=True)


class Router(nn.Module):
    """Router weights in float32: the top-k choice is sensitive to rounding of the logits."""

    def __init__(self, hidden_size: int, cfg: MoEConfig) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.num_experts, hidden_size), False)
        self.e_score_correction_bias = (
            nn.Parameter(torch.zeros(cfg.num_experts), False)
            if cfg.scoring == "grouped_sigmoid"
            else None
        )


class SparseMoE(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        cfg: MoEConfig,
        dtype: torch.dtype,
        shared_experts: nn.Module | None = None,
        kernels: KernelOptions = TORCH_REFERENCE,
        method: ExpertMethod | None = None,
        prefix: str = "mlp",
        tp: TPGroup = SINGLE,
        shared_expert: bool = False,
    ) -> None:
        """``shared_experts``: a separate shared MLP; ``shared_expert``: the shared expert held
        as expert E of the stacks instead (module docstring)."""
        super().__init__()
        # Tensor parallelism: every rank holds every expert's slice of the intermediate size
        # (gate/up rows, down columns); the router is whole on each rank.
        self.tp, self.full_intermediate = tp, cfg.expert_intermediate_size
        if tp.is_parallel:
            local = tp.split(cfg.expert_intermediate_size, f"{prefix} expert intermediate size")
            cfg = dataclasses.replace(cfg, expert_intermediate_size=local)
        self.cfg, self.kernels, self.hidden_size, self.prefix = cfg, kernels, hidden_size, prefix
        assert not (shared_expert and shared_experts), "the shared expert is stacked or separate"
        self.shared_expert = shared_expert
        self.stacked_experts = cfg.num_experts + int(shared_expert)
        self.gate = Router(hidden_size, cfg)
        self.method = method or UnquantizedExpertMethod()
        self.method.create_weights(self, dtype)
        self.shared_experts = shared_experts
        self._loaded: set[tuple[int, str, str]] = set()

    def missing(self) -> list[str]:
        """Checkpoint names (relative to this layer) of expert tensors not loaded yet."""
        return [
            f"{self.checkpoint_expert(e)}.{proj}.{name}"
            for e in range(self.stacked_experts)
            for proj in EXPERT_SHARDS
            for name in self.method.required()
            if (e, proj, name) not in self._loaded
        ]

    def checkpoint_expert(self, expert: int) -> str:
        """The checkpoint's name (relative to this layer) of stacked expert ``expert``."""
        return "shared_experts" if expert == self.cfg.num_experts else f"experts.{expert}"

    def load_expert(self, expert: int, proj: str, loaded: torch.Tensor) -> str:
        """Read one checkpoint tensor ``experts.{expert}.{proj}`` (``proj`` may carry the
        tensor name: ``gate_proj.weight_scale``; bare, it is the weight) into the stacks; the
        name of the stack it went to."""
        if not 0 <= expert < self.cfg.num_experts:
            raise ValueError(f"no expert tensor experts.{expert}.{proj} in this layer")
        return self._load_stacked(expert, proj, loaded)

    def load_shared_expert(self, proj: str, loaded: torch.Tensor) -> str:
        """``shared_experts.{proj}`` into stacked expert E, as ``load_expert``."""
        if not self.shared_expert:
            raise ValueError(f"shared_experts.{proj} is not stacked in this layer")
        return self._load_stacked(self.cfg.num_experts, proj, loaded)

    def _load_stacked(self, expert: int, proj: str, loaded: torch.Tensor) -> str:
        proj, _, name = proj.partition(".")
        name = name or "weight"
        what = f"{self.checkpoint_expert(expert)}.{proj}.{name}"
        reader = self.method.readers().get(name)
        if proj not in EXPERT_SHARDS or not reader:
            raise ValueError(f"no expert tensor {what} in this layer")
        if self.tp.is_parallel:
            loaded = self._rank_slice(loaded, proj, what)
        load_rows(self, expert, proj, reader(loaded, projection_rows(self, proj)), what)
        self._loaded.add((expert, proj, name))
        return EXPERT_SHARDS[proj][0]

    def _rank_slice(self, loaded: torch.Tensor, proj: str, what: str) -> torch.Tensor:
        full, rank, size = self.full_intermediate, self.tp.rank, self.tp.size
        if proj == "down_proj":
            return row_shard(loaded, full, rank, size, what)
        local = self.cfg.expert_intermediate_size
        return column_shard(loaded, full, rank * local, local, what)

    def expert_params(self) -> list[str]:
        """Names of this layer's own parameters (the stacks; not the router's)."""
        return [name for name, _ in self.named_parameters(recurse=False)]

    def finish_loading(self) -> None:
        self.method.process_after_loading(self)

    def init_dummy(self, gen: torch.Generator) -> None:
        self.method.init_dummy(self, gen)
        self.finish_loading()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.gate.e_score_correction_bias
        weights, ids = route(x, self.gate.weight, self.cfg, bias, self.kernels, self.shared_expert)
        return self._experts(x, weights, ids)

    def forward_after_norm(
        self, x: torch.Tensor, residual: torch.Tensor, norm: RMSNorm
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(self(norm(x + residual)), x + residual)`` with the norm in the router's kernel
        (``moe_router.normed_route``), or None where that path does not take the step."""
        routed = normed_route(
            x, residual, norm.weight, norm.eps, self.gate.weight, self.cfg,
            self.gate.e_score_correction_bias, self.kernels, self.shared_expert,
            self.router_warm,
        )  # fmt: skip
        if routed is None:
            return None
        normed, residual, weights, ids = routed
        return self._experts(normed, weights, ids), residual

    @functools.cached_property
    def router_warm(self) -> torch.Tensor | None:
        """A stacked shared expert's gate/up rows, which the router's kernel asks L2 for at
        decode (``kernels.l2_warm``): read at the first step, after loading."""
        return shared_expert_warm(self)

    def _experts(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.is_parallel:  # the shared expert's row-parallel down reduces on its own
            out = all_reduce(self.method.apply(self, x, weights, ids, self.kernels.triton), self.tp)
            return out if self.shared_experts is None else out + self.shared_experts(x)
        # The shared expert first: the experts' sum is added to its output by their last kernel
        shared = None if self.shared_experts is None else self.shared_experts(x)
        return self.method.apply(self, x, weights, ids, self.kernels.triton, shared)
