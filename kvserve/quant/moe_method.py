"""The expert-method protocol: how a mixture-of-experts layer (``kvserve.layers.moe``) stores
its stacked experts, takes per-expert checkpoint tensors, and runs the experts. The MoE
counterpart of ``method.LinearMethod``; one method object serves every MoE layer of a model.

A layer's stacks are parameters on the layer: ``w13`` [E, 2I, ...] (each expert's gate rows,
then its up rows) and ``w2`` [E, H, ...] (down), plus per-format companions named
``<stack><suffix>`` (``w13_scale``, ``w2_row_scale``, ...). A checkpoint tensor
``experts.{e}.{proj}.{name}`` goes through the method's reader for ``name``, which returns
rows of the projection keyed by suffix; ``load_rows`` copies them into expert ``e``'s slice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch

from kvserve.errors import ModelLoadError
from kvserve.quant.method import copy_checked

if TYPE_CHECKING:
    from kvserve.layers.moe import SparseMoE

# (checkpoint tensor of one expert projection, the projection's row count) -> {suffix: rows}
ExpertReader = Callable[[torch.Tensor, int], dict[str, torch.Tensor]]
# checkpoint projection -> (stack, shard index within the expert's rows)
EXPERT_SHARDS = {"gate_proj": ("w13", 0), "up_proj": ("w13", 1), "down_proj": ("w2", 0)}


class ExpertMethod(Protocol):
    def create_weights(self, moe: SparseMoE, dtype: torch.dtype) -> None:
        """Register the stacks (shapes from ``moe.cfg`` and ``moe.hidden_size``)."""

    def readers(self) -> dict[str, ExpertReader]:
        """Checkpoint tensor names of one expert projection -> their readers."""

    def required(self) -> tuple[str, ...]:
        """The names every expert projection must receive (the loader checks them)."""

    def process_after_loading(self, moe: SparseMoE) -> None:
        """Called once after every tensor is in (or after dummy init)."""

    def init_dummy(self, moe: SparseMoE, gen: torch.Generator) -> None:
        """Random stacks in the method's layout (``--load-format dummy``)."""

    def apply(
        self,
        moe: SparseMoE,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        triton: bool,
        addend: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Each token through its top-k experts, summed with the router weights, plus
        ``addend`` [T, H] (a shared expert's output; the kernels may write the result over
        it)."""


def projection_rows(moe: SparseMoE, proj: str) -> int:
    """Rows of one expert's ``proj`` weight: I for gate/up, H for down."""
    return moe.hidden_size if proj == "down_proj" else moe.cfg.expert_intermediate_size


def load_rows(
    moe: SparseMoE, expert: int, proj: str, rows: dict[str, torch.Tensor], what: str
) -> None:
    """Copy a reader's output into expert ``expert``'s slice of each ``<stack><suffix>``; a
    gate/up tensor fills the first/second half of the expert's rows."""
    stack, shard = EXPERT_SHARDS[proj]
    for suffix, value in rows.items():
        param = getattr(moe, stack + suffix).data[expert]
        per_shard = param.shape[0] // 2 if stack == "w13" else param.shape[0]
        target = param[shard * per_shard : (shard + 1) * per_shard]
        copy_checked(target, value.to(param.device), f"{what} -> {stack}{suffix}")


def check_divides(moe: SparseMoE, rows: int, cols: int, why: str) -> None:
    """Refuse expert shapes whose I or H do not split into ``rows`` x ``cols`` tiles."""
    inter, hidden = moe.cfg.expert_intermediate_size, moe.hidden_size
    if inter % rows or hidden % rows or inter % cols or hidden % cols:
        raise ModelLoadError(
            f"{moe.prefix}: {why} needs hidden size {hidden} and expert intermediate size "
            f"{inter} to be multiples of {max(rows, cols)}"
        )
