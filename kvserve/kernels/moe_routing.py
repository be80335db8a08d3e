"""Top-k routing: router logits -> each token's k experts and their weights, float32, best
first. Softmax scoring (Qwen3-MoE, Mixtral) and grouped sigmoid scoring (GLM-4.5, DeepSeek-V3;
see ``kvserve.layers.moe_router``). One Triton program per token replaces the scoring, top-k,
renormalisation and index-cast kernels (a dozen and more for the grouped scoring), which at
decode cost more than the routing itself; the ``*_reference`` functions are the same in torch.

``shared``: a layer whose shared expert runs as one more expert of its stacks
(``kvserve.layers.moe``) routes every token to it too: the rows get ``k + 1`` columns, the
last naming expert ``E`` (the stack's extra one) with weight 1.0, so the experts' kernels run it
with the routed ones and no launch of its own."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvserve.kernels._triton import (
    constexpr,
    jit,
    launch_options,
    next_pow2,
    pdl_release,
    pdl_wait,
    require_triton,
    tl,
)


def with_shared_slot(
    weights: torch.Tensor, ids: torch.Tensor, num_experts: int, shared: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, ids) [T, k], plus with ``shared`` a last column for the shared expert: id
    ``num_experts`` (the routed expert count), weight 1.0."""
    if not shared:
        return weights, ids
    tokens = ids.shape[0]
    extra_w = torch.ones(tokens, 1, dtype=weights.dtype, device=weights.device)
    extra_id = torch.full((tokens, 1), num_experts, dtype=ids.dtype, device=ids.device)
    return torch.cat([weights, extra_w], 1), torch.cat([ids, extra_id], 1)


def routed_outputs(
    tokens: int, top_k: int, shared: bool, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty (weights fp32, ids int32) [T, k], or [T, k + 1] with ``shared``."""
    slots = top_k + int(shared)
    weights = torch.empty(tokens, slots, dtype=torch.float32, device=device)
    return weights, torch.empty(tokens, slots, dtype=torch.int32, device=device)


def softmax_topk_reference(
    logits: torch.Tensor, top_k: int, renormalize: bool, shared: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] float32, expert ids [T, k] int32), best first; [T, k + 1] with
    ``shared``."""
    probs = logits.softmax(dim=-1, dtype=torch.float32)
    weights, ids = probs.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return with_shared_slot(weights, ids.to(torch.int32), logits.shape[1], shared)


@jit
def _top_keys(values, lanes, NUM_LANES: tl.constexpr, BLOCK_K: tl.constexpr):
    """The BLOCK_K largest of ``values`` (2-D float32; ``lanes`` their distinct numbers below
    NUM_LANES) as int64 keys, best first and the lowest lane among equal values: each key the
    value's bits (made order-preserving as a signed integer) in the high half and the reversed
    lane in the low half, picked by Triton's bitonic top-k. (Before s67, one key maximum a
    pick; sm_90 SASS of the top-k kernels at 128 experts, top 8: softmax 34 barriers and 171
    shuffles, grouped sigmoid 28 and 157; with the bitonic top-k 18 / 103 and 12 / 89, and
    softmax 5 / 50 once its weights came from the keys.)"""
    bits = values.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)  # negative floats: magnitude flipped
    keys = (ordered.to(tl.int64) << 32) | (NUM_LANES - 1 - lanes).to(tl.int64)
    count: tl.constexpr = keys.shape[0] * keys.shape[1]
    return tl.topk(tl.reshape(keys, (count,)), BLOCK_K)


@jit
def _key_lanes(keys, NUM_LANES: tl.constexpr):
    """The lanes of ``_top_keys``' keys (int32)."""
    return (NUM_LANES - 1 - (keys & 0xFFFFFFFF)).to(tl.int32)


@jit
def _key_values(keys):
    """The float32 values of ``_top_keys``' keys (their high halves, order-preserving bits)."""
    ordered = (keys >> 32).to(tl.int32)
    return tl.where(ordered >= 0, ordered, ordered ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)


@jit
def _store_top(
    weights_row, ids_row, values, lanes, picked, ids, scale, num_experts,
    RENORMALIZE: tl.constexpr, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr, SHARED: tl.constexpr,
):  # fmt: skip
    """Stores the picked lanes' ``values`` (2-D, as ``_top_keys``'), times ``scale`` and, with
    RENORMALIZE, over their sum, and their expert ``ids`` (``_store_weights_ids``)."""
    hit = lanes[None, :, :] == picked[:, None, None]
    weights = tl.sum(tl.sum(tl.where(hit, values[None, :, :], 0.0), axis=2), axis=1)
    real = tl.arange(0, BLOCK_K) < TOP_K
    if RENORMALIZE:
        scale = scale / (tl.sum(tl.where(real, weights, 0.0), axis=0) + 1e-20)
    _store_weights_ids(weights_row, ids_row, weights * scale, ids, num_experts, TOP_K, BLOCK_K,
                       SHARED)  # fmt: skip


@jit
def _store_weights_ids(
    weights_row, ids_row, weights, ids, num_experts, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr,
    SHARED: tl.constexpr,
):  # fmt: skip
    """The first TOP_K of ``weights`` and ``ids`` ([BLOCK_K]): one vector store each; with
    SHARED the shared expert (id ``num_experts``, weight 1.0) after them."""
    real = tl.arange(0, BLOCK_K) < TOP_K
    tl.store(weights_row + tl.arange(0, BLOCK_K), weights, mask=real)
    tl.store(ids_row + tl.arange(0, BLOCK_K), ids, mask=real)
    if SHARED:
        tl.store(weights_row + TOP_K, 1.0)
        tl.store(ids_row + TOP_K, num_experts)


@jit
def softmax_topk_row(
    logits_row, weights_row, ids_row, num_experts,
    TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
    SHARED: tl.constexpr,
):  # fmt: skip
    """One token's softmax top-k: its logits at ``logits_row`` (read from L2: the fused router
    kernel's other programs wrote them), its k weights and ids to the two rows."""
    cols = tl.arange(0, BLOCK_E)[None, :]  # [1, BLOCK_E]: the 2-D lanes of _top_keys
    valid = cols < num_experts
    x = tl.load(logits_row + cols, mask=valid, other=-float("inf"), cache_modifier=".cg")
    x = x.to(tl.float32)
    # softmax keeps the logits' order: the top logits, best first, are the top probabilities
    top = _top_keys(x, cols, BLOCK_E, BLOCK_K)
    top_x = _key_values(top)
    real = tl.arange(0, BLOCK_K) < TOP_K
    best = tl.max(top_x, axis=0)
    e = tl.where(real, tl.exp(top_x - best), 0.0)
    # RENORMALIZE: the k probabilities over their sum, in which the softmax's sum cancels
    total = tl.sum(e, axis=0) if RENORMALIZE else tl.sum(tl.sum(tl.exp(x - best), axis=1), axis=0)
    weights = e / total
    _store_weights_ids(weights_row, ids_row, weights, _key_lanes(top, BLOCK_E), num_experts,
                       TOP_K, BLOCK_K, SHARED)  # fmt: skip


@jit
def _softmax_topk_kernel(
    logits_ptr,
    weights_ptr,
    ids_ptr,
    num_experts,
    stride_logits,
    TOP_K: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SHARED: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    pdl_release(USE_PDL)
    token = tl.program_id(0).to(tl.int64)
    row = token * (TOP_K + SHARED)
    softmax_topk_row(
        logits_ptr + token * stride_logits, weights_ptr + row, ids_ptr + row, num_experts, TOP_K,
        RENORMALIZE, BLOCK_E, BLOCK_K, SHARED,
    )  # fmt: skip


def softmax_topk(
    logits: torch.Tensor, top_k: int, renormalize: bool, shared: bool = False, *, pdl: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    require_triton()
    tokens, experts = logits.shape
    weights, ids = routed_outputs(tokens, top_k, shared, logits.device)
    if tokens:
        _softmax_topk_kernel[(tokens,)](
            logits, weights, ids, experts, logits.stride(0), TOP_K=top_k,
            RENORMALIZE=renormalize, BLOCK_E=next_pow2(experts), BLOCK_K=next_pow2(top_k),
            SHARED=shared, num_warps=4,
            **launch_options(pdl),
        )  # fmt: skip
    return weights, ids


def grouped_sigmoid_topk_reference(
    logits: torch.Tensor,  # [T, E]
    top_k: int,
    num_groups: int,
    topk_groups: int,
    renormalize: bool,
    scaling: float,
    correction_bias: torch.Tensor | None = None,  # [E]
    shared: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] float32, expert ids [T, k] int32), best first; [T, k + 1] with
    ``shared``."""
    scores = logits.float().sigmoid()
    choice = scores if correction_bias is None else scores + correction_bias
    tokens, experts = choice.shape
    per_group = experts // num_groups
    grouped = choice.view(tokens, num_groups, per_group)
    group_score = grouped.topk(min(2, per_group), dim=-1).values.sum(dim=-1)  # [T, G]
    kept_groups = group_score.topk(topk_groups, dim=-1).indices
    group_mask = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, kept_groups, True)
    expert_mask = group_mask.unsqueeze(-1).expand(-1, -1, per_group).reshape(tokens, experts)
    ids = choice.masked_fill(~expert_mask, float("-inf")).topk(top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return with_shared_slot(weights * scaling, ids.to(torch.int32), experts, shared)


@jit
def grouped_sigmoid_topk_row(
    logits_row, bias_ptr, weights_row, ids_row, scaling,
    GROUPS: tl.constexpr, PER_GROUP: tl.constexpr, TOPK_GROUPS: tl.constexpr,
    TOP_K: tl.constexpr, HAS_BIAS: tl.constexpr, RENORMALIZE: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr, SHARED: tl.constexpr,
):  # fmt: skip
    """One token's grouped sigmoid top-k (logits read from L2, as ``softmax_topk_row``)."""
    group = tl.arange(0, BLOCK_G)
    member = tl.arange(0, BLOCK_P)[None, :]
    lane = group[:, None] * BLOCK_P + member  # distinct, and ordered as the experts are
    valid = (group[:, None] < GROUPS) & (member < PER_GROUP)
    # [BLOCK_G, BLOCK_P]; a padding lane's number may repeat a real expert's (member >=
    # PER_GROUP), so its score is 0 and its choice -inf: it is never picked nor summed
    expert = group[:, None] * PER_GROUP + member
    x = tl.load(logits_row + expert, mask=valid, other=0.0, cache_modifier=".cg")
    scores = tl.where(valid, tl.sigmoid(x.to(tl.float32)), 0.0)
    choice = scores
    if HAS_BIAS:
        choice = scores + tl.load(bias_ptr + expert, mask=valid, other=0.0)
    choice = tl.where(valid, choice, -float("inf"))
    if TOPK_GROUPS < GROUPS:
        # A group's score: the sum of its two best choices (its one, for one-expert groups).
        first = tl.max(choice, axis=1)
        first_at = tl.min(tl.where(choice == first[:, None], member, BLOCK_P), axis=1)
        group_score = first
        if PER_GROUP > 1:
            rest = tl.where(member == first_at[:, None], -float("inf"), choice)
            group_score = first + tl.max(rest, axis=1)
        group_score = tl.where(group < GROUPS, group_score, -float("inf"))
        kept = tl.zeros([BLOCK_G], dtype=tl.int32)
        for _ in tl.static_range(TOPK_GROUPS):
            best = tl.max(group_score, axis=0)
            at = tl.min(tl.where(group_score == best, group, BLOCK_G), axis=0)
            kept = tl.where(group == at, 1, kept)
            group_score = tl.where(group == at, -float("inf"), group_score)
        choice = tl.where(kept[:, None] > 0, choice, -float("inf"))
    picked = _key_lanes(_top_keys(choice, lane, BLOCK_G * BLOCK_P, BLOCK_K), BLOCK_G * BLOCK_P)
    ids = (picked // BLOCK_P) * PER_GROUP + picked % BLOCK_P
    _store_top(weights_row, ids_row, scores, lane, picked, ids, scaling, GROUPS * PER_GROUP,
               RENORMALIZE, TOP_K, BLOCK_K, SHARED)  # fmt: skip


@jit
def _grouped_sigmoid_topk_kernel(
    logits_ptr,
    bias_ptr,
    weights_ptr,
    ids_ptr,
    stride_logits,
    scaling,
    GROUPS: tl.constexpr,
    PER_GROUP: tl.constexpr,
    TOPK_GROUPS: tl.constexpr,
    TOP_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SHARED: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pdl_wait(USE_PDL)
    pdl_release(USE_PDL)
    token = tl.program_id(0).to(tl.int64)
    row = token * (TOP_K + SHARED)
    grouped_sigmoid_topk_row(
        logits_ptr + token * stride_logits, bias_ptr, weights_ptr + row, ids_ptr + row, scaling,
        GROUPS, PER_GROUP, TOPK_GROUPS, TOP_K, HAS_BIAS, RENORMALIZE, BLOCK_G, BLOCK_P, BLOCK_K,
        SHARED,
    )  # fmt: skip


def grouped_sigmoid_topk(
    logits: torch.Tensor,
    top_k: int,
    num_groups: int,
    topk_groups: int,
    renormalize: bool,
    scaling: float,
    correction_bias: torch.Tensor | None = None,
    shared: bool = False,
    *,
    pdl: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The GPU path of ``grouped_sigmoid_topk_reference`` (same arguments)."""
    require_triton()
    tokens, experts = logits.shape
    logits = logits if logits.stride(1) == 1 else logits.contiguous()
    per_group = experts // num_groups
    weights, ids = routed_outputs(tokens, top_k, shared, logits.device)
    if tokens:
        bias = correction_bias if correction_bias is not None else weights
        _grouped_sigmoid_topk_kernel[(tokens,)](
            logits, bias, weights, ids, logits.stride(0), float(scaling), GROUPS=num_groups,
            PER_GROUP=per_group, TOPK_GROUPS=topk_groups, TOP_K=top_k,
            HAS_BIAS=correction_bias is not None, RENORMALIZE=renormalize,
            BLOCK_G=next_pow2(num_groups), BLOCK_P=next_pow2(per_group),
            BLOCK_K=next_pow2(top_k), SHARED=shared, num_warps=4,
            **launch_options(pdl),
        )  # fmt: skip
    return weights, ids


SOFTMAX, GROUPED_SIGMOID = 1, 2  # ``Routing.constants()["SCORING"]``
SOFTMAX_SCORING = constexpr(SOFTMAX)


@dataclass(frozen=True)
class Routing:
    """A layer's expert choice as a kernel that computes it after the router logits takes it
    (``router_logits.router_topk``): softmax or grouped sigmoid top-k and their settings."""

    num_experts: int
    top_k: int
    renormalize: bool
    grouped_sigmoid: bool = False
    num_groups: int = 1
    topk_groups: int = 1
    scaling: float = 1.0
    shared: bool = False  # a last column for the shared expert (module docstring)

    def constants(self, has_bias: bool) -> dict[str, int | bool]:
        """The constexprs of ``topk_row``."""
        per_group = self.num_experts // self.num_groups
        return {
            "SCORING": GROUPED_SIGMOID if self.grouped_sigmoid else SOFTMAX,
            "TOP_K": self.top_k,
            "RENORMALIZE": self.renormalize,
            "BLOCK_ALL_E": next_pow2(self.num_experts),
            "GROUPS": self.num_groups,
            "PER_GROUP": per_group,
            "TOPK_GROUPS": self.topk_groups,
            "HAS_BIAS": has_bias,
            "BLOCK_G": next_pow2(self.num_groups),
            "BLOCK_P": next_pow2(per_group),
            "BLOCK_K": next_pow2(self.top_k),
            "SHARED": self.shared,
        }


@jit
def topk_row(
    logits_row, bias_ptr, weights_row, ids_row, num_experts, scaling,
    SCORING: tl.constexpr, TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr,
    BLOCK_ALL_E: tl.constexpr, GROUPS: tl.constexpr, PER_GROUP: tl.constexpr,
    TOPK_GROUPS: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr, SHARED: tl.constexpr,
):  # fmt: skip
    """One token's top-k by ``Routing``'s scoring."""
    if SCORING == SOFTMAX_SCORING:
        softmax_topk_row(
            logits_row, weights_row, ids_row, num_experts, TOP_K, RENORMALIZE, BLOCK_ALL_E, BLOCK_K,
            SHARED,
        )  # fmt: skip
    else:
        grouped_sigmoid_topk_row(
            logits_row, bias_ptr, weights_row, ids_row, scaling, GROUPS, PER_GROUP, TOPK_GROUPS,
            TOP_K, HAS_BIAS, RENORMALIZE, BLOCK_G, BLOCK_P, BLOCK_K, SHARED,
        )  # fmt: skip
