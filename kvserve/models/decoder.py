"""The decoder-only transformer shared by the Llama, Qwen2, Qwen3 and MoE families. Family
files only choose features that ``ModelConfig`` carries (q/k/v bias, q/k norm, partial
rotary, mixture-of-experts layers)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from kvserve.config import ModelConfig, MoEConfig
from kvserve.distributed.parallel_state import SINGLE, TPGroup
from kvserve.errors import ModelLoadError
from kvserve.kernels.options import TORCH_REFERENCE, KernelOptions
from kvserve.kernels.rotary_store_kv import QKNorm, fusable, rotary_store_kv
from kvserve.kernels.word_gemv import gated_gemv_enabled
from kvserve.layers.activation import SiluAndMul
from kvserve.layers.embedding import LMHead, VocabEmbedding
from kvserve.layers.linear import Linear
from kvserve.layers.moe import SparseMoE, shared_expert_fusion
from kvserve.layers.norm import RMSNorm
from kvserve.layers.parallel_linear import (
    ColumnParallelLinear,
    RowParallelLinear,
    even_parts,
    local_kv_heads,
)
from kvserve.layers.rotary import RotaryEmbedding
from kvserve.models.forward_context import ForwardContext
from kvserve.models.kv_cache_scales import KVCacheScales
from kvserve.quant.fp8_activation import Fp8Activation
from kvserve.quant.permuted_activation import PermutedActivation
from kvserve.quant.registry import (
    UNQUANTIZED,
    QuantConfig,
    expert_method,
    linear_method,
    same_expert_format,
)

# checkpoint name fragment -> (merged module name, shard index)
STACKED_PARAMS: dict[str, tuple[str, int]] = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


def _linear(
    quant: QuantConfig, prefix: str, names: list[str], in_features: int, sizes: list[int],
    bias: bool, dtype: torch.dtype, kernels: KernelOptions, tp: TPGroup = SINGLE,
    split: str = "", parts: list[tuple[int, int]] | None = None,
) -> Linear:  # fmt: skip
    """A linear layer whose shards the checkpoint names ``prefix.<name>``, with its method;
    under tensor parallelism ``split`` "column" (``parts``: rows per shard, default an even
    split) or "row". The method's own kernels launch with ``kernels.pdl``."""
    method = linear_method(quant, [f"{prefix}.{n}" for n in names])
    merged = prefix + "." + _MERGED.get(names[0], names[0])
    if not tp.is_parallel:
        layer = Linear(in_features, sizes, bias, dtype, method, merged)
    elif split == "row":
        layer = RowParallelLinear(in_features, sizes, bias, dtype, tp, method, merged)
    else:
        parts = parts or even_parts(sizes, tp, merged)
        layer = ColumnParallelLinear(in_features, sizes, parts, bias, dtype, method, merged)
    layer.launch_pdl = kernels.pdl
    return layer


_MERGED = {"q_proj": "qkv_proj", "gate_proj": "gate_up_proj"}


class Attention(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        layer_idx: int,
        dtype: torch.dtype,
        rotary: RotaryEmbedding,
        quant: QuantConfig = UNQUANTIZED,
        tp: TPGroup = SINGLE,
    ):
        super().__init__()
        self.layer_idx = layer_idx
        prefix = f"model.layers.{layer_idx}.self_attn"
        hd = self.head_dim = cfg.head_dim
        # This rank's heads: q heads split evenly, KV heads split or replicated.
        self.num_heads = tp.split(cfg.num_heads, f"{prefix} attention heads")
        first_kv, self.num_kv_heads = local_kv_heads(cfg.num_kv_heads, tp)
        self.q_size, self.kv_size = self.num_heads * hd, self.num_kv_heads * hd
        self.scale = cfg.head_dim**-0.5
        kv_part = (first_kv * hd, self.kv_size)
        self.qkv_proj = _linear(
            quant, prefix, ["q_proj", "k_proj", "v_proj"], cfg.hidden_size,
            [cfg.q_size, cfg.kv_size, cfg.kv_size], cfg.attention_bias, dtype, rotary.kernels,
            tp, "column", [(tp.rank * self.q_size, self.q_size), kv_part, kv_part],
        )  # fmt: skip
        self.o_proj = _linear(
            quant, prefix, ["o_proj"], cfg.q_size, [cfg.hidden_size], False, dtype,
            rotary.kernels, tp, "row",
        )  # fmt: skip
        self.rotary = rotary
        kernels = rotary.kernels
        self.q_norm = (
            RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype, kernels) if cfg.qk_norm else None
        )
        self.k_norm = (
            RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype, kernels) if cfg.qk_norm else None
        )
        # What the fused rotary + KV-store kernel needs, fixed by the config (the norm weights
        # are loaded in place into these parameters)
        self.fusable_heads = fusable(rotary.head_dim, self.head_dim)
        self.qk_norm = (
            QKNorm(self.q_norm.weight, self.k_norm.weight, cfg.rms_norm_eps)
            if self.q_norm is not None and self.k_norm is not None
            else None
        )

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor | Fp8Activation | PermutedActivation,
        ctx: ForwardContext,
    ) -> torch.Tensor:
        qkv = self.qkv_proj(hidden)
        if self._fuses_rotary_store(ctx):
            out = self._rotary_store_attend(positions, qkv, ctx)
        else:
            out = self._rotary_then_backend(positions, qkv, ctx)
        return self.o_proj(out.flatten(1))

    def _fuses_rotary_store(self, ctx: ForwardContext) -> bool:
        """q/k norms (Qwen3), rotary (partial too: GLM-4.5) and the KV store in one kernel
        straight from the qkv output (Triton path), where the kernel takes the head shapes."""
        return self.rotary.kernels.triton and ctx.backend.fuses_rotary_store and self.fusable_heads

    def _rotary_store_attend(
        self, positions: torch.Tensor, qkv: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        kv_cache, kv_scales = ctx.kv.layer(self.layer_idx), ctx.kv.scales(self.layer_idx)
        q = rotary_store_kv(
            qkv,
            positions,
            self.rotary.cos_sin_cache,
            kv_cache,
            ctx.meta.slot_mapping,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            kv_scales=kv_scales,
            qk_norm=self.qk_norm,
            pdl=self.rotary.kernels.pdl,
        )
        return ctx.backend.attend(q, kv_cache, ctx.meta, self.scale, kv_scales)

    def _rotate(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotary over the leading ``rotary.head_dim`` dims of each head (all of them but for
        partial-rotary models such as GLM-4.5, whose other dims pass through)."""
        rot = self.rotary.head_dim
        if rot == self.head_dim:
            return self.rotary(positions, q.contiguous(), k.contiguous())
        qh = q.reshape(-1, self.num_heads, self.head_dim)
        kh = k.reshape(-1, self.num_kv_heads, self.head_dim)
        q_rot, k_rot = self.rotary(
            positions, qh[..., :rot].flatten(1).contiguous(), kh[..., :rot].flatten(1).contiguous()
        )
        q = torch.cat((q_rot.view(-1, self.num_heads, rot), qh[..., rot:]), dim=-1)
        k = torch.cat((k_rot.view(-1, self.num_kv_heads, rot), kh[..., rot:]), dim=-1)
        return q.flatten(1), k.flatten(1)

    def _rotary_then_backend(
        self, positions: torch.Tensor, qkv: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(q.reshape(-1, self.head_dim)).view(q.shape)
            k = self.k_norm(k.reshape(-1, self.head_dim)).view(k.shape)
        q, k = self._rotate(positions, q, k)
        return ctx.backend.forward(
            q.view(-1, self.num_heads, self.head_dim),
            k.view(-1, self.num_kv_heads, self.head_dim),
            v.contiguous().view(-1, self.num_kv_heads, self.head_dim),
            ctx.kv.layer(self.layer_idx),
            ctx.meta,
            self.scale,
            ctx.kv.scales(self.layer_idx),
        )


class MLP(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        dtype: torch.dtype,
        kernels: KernelOptions,
        prefix: str = "mlp",
        quant: QuantConfig = UNQUANTIZED,
        intermediate_size: int | None = None,
        tp: TPGroup = SINGLE,
    ) -> None:
        super().__init__()
        size = intermediate_size or cfg.intermediate_size
        self.gate_up_proj = _linear(
            quant, prefix, ["gate_proj", "up_proj"], cfg.hidden_size, [size, size], False, dtype,
            kernels, tp, "column",
        )  # fmt: skip
        self.down_proj = _linear(
            quant, prefix, ["down_proj"], size, [cfg.hidden_size], False, dtype, kernels, tp, "row"
        )
        self.act = SiluAndMul(kernels)
        # steps the gate/up method runs on the word GEMV take the SiLU-mul in its epilogue
        self.gated_gemv = kernels.triton and gated_gemv_enabled()

    def forward(self, x: torch.Tensor | Fp8Activation | PermutedActivation) -> torch.Tensor:
        on_gemv = self.gated_gemv and isinstance(x, torch.Tensor)
        hidden = self.gate_up_proj.forward_gated(x) if on_gemv else None
        if hidden is not None:
            return self.down_proj(hidden)
        gate_up = self.gate_up_proj(x)
        out = self.down_proj.forward_after_silu_mul(gate_up)
        return out if out is not None else self.down_proj(self.act(gate_up))


def _feed_forward(
    cfg: ModelConfig, idx: int, dtype: torch.dtype, kernels: KernelOptions, quant: QuantConfig,
    tp: TPGroup = SINGLE,
) -> nn.Module:  # fmt: skip
    """The layer's dense MLP, or its mixture of experts (plus a shared expert when the config
    has one) when ``cfg.moe`` makes this layer sparse."""
    prefix = f"model.layers.{idx}.mlp"
    moe = cfg.moe
    if moe is None or not moe.is_sparse(idx):
        return MLP(cfg, dtype, kernels, prefix, quant, tp=tp)
    shared, shared_prefix = None, f"{prefix}.shared_experts"
    stacked = _stacks_shared_expert(moe, quant, prefix)
    if moe.shared_expert_intermediate_size and not stacked:
        shared = MLP(
            cfg, dtype, kernels, shared_prefix, quant, moe.shared_expert_intermediate_size, tp
        )
    method = expert_method(quant, f"{prefix}.experts")
    return SparseMoE(cfg.hidden_size, moe, dtype, shared, kernels, method, prefix, tp, stacked)


def _stacks_shared_expert(moe: MoEConfig, quant: QuantConfig, prefix: str) -> bool:
    """Whether the layer holds its shared expert as one more expert of its stacks
    (``kvserve.layers.moe``): one of the routed experts' size, in their format, and
    ``KVSERVE_SHARED_EXPERT_FUSION`` not 0."""
    return (
        moe.shared_expert_fits_stacks
        and shared_expert_fusion()
        and same_expert_format(quant, f"{prefix}.experts", f"{prefix}.shared_experts")
    )


class DecoderLayer(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        idx: int,
        dtype: torch.dtype,
        rotary: RotaryEmbedding,
        quant: QuantConfig = UNQUANTIZED,
        tp: TPGroup = SINGLE,
    ):
        super().__init__()
        kernels = rotary.kernels
        self.self_attn = Attention(cfg, idx, dtype, rotary, quant, tp)
        self.mlp = _feed_forward(cfg, idx, dtype, kernels, quant, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, kernels)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, kernels)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        ctx: ForwardContext,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        normed, residual = _norm(self.input_layernorm, hidden, residual, self.self_attn.qkv_proj)
        hidden = self.self_attn(positions, normed, ctx)
        if isinstance(self.mlp, SparseMoE):
            fused = self.mlp.forward_after_norm(hidden, residual, self.post_attention_layernorm)
            if fused is not None:
                return fused
        mlp_input = self.mlp.gate_up_proj if isinstance(self.mlp, MLP) else None
        normed, residual = _norm(self.post_attention_layernorm, hidden, residual, mlp_input)
        return self.mlp(normed), residual


def _norm(
    norm: RMSNorm, hidden: torch.Tensor, residual: torch.Tensor | None, consumer: Linear | None
) -> tuple[torch.Tensor | Fp8Activation | PermutedActivation, torch.Tensor]:
    """``(norm(hidden (+ residual)), hidden (+ residual))``; the first already in e4m3, or in
    an FP4 GEMM's step order, where the linear layer it feeds would quantize or permute it by a
    kernel of its own (``fp8_input_scheme``, ``step_order``)."""
    scheme = consumer.fp8_input_scheme(hidden) if consumer is not None else None
    if scheme is not None:
        return norm.forward_fp8(hidden, residual, scheme)
    bits = consumer.step_order(hidden) if consumer is not None else None
    if bits is not None:
        return norm.forward_permuted(hidden, residual, bits)
    if residual is None:
        return norm(hidden), hidden
    return norm(hidden, residual)


class DecoderModel(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        dtype: torch.dtype,
        max_positions: int,
        kernels: KernelOptions,
        quant: QuantConfig = UNQUANTIZED,
        tp: TPGroup = SINGLE,
    ) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size, dtype, tp)
        rotary = RotaryEmbedding(
            cfg.rotary_dim or cfg.head_dim, max_positions, cfg.rope_theta, cfg.rope_scaling,
            kernels,
        )  # fmt: skip
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, i, dtype, rotary, quant, tp) for i in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, kernels)

    def forward(
        self, token_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        hidden, residual = self.embed_tokens(token_ids), None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual, ctx)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class DecoderForCausalLM(nn.Module):
    """Llama-style causal LM: ``forward`` gives final hidden states for every new row;
    ``compute_logits`` projects only the rows that are sampled. ``kernels``: which layers run
    their Triton kernel (the torch references by default)."""

    def __init__(
        self,
        cfg: ModelConfig,
        dtype: torch.dtype,
        max_positions: int,
        kernels: KernelOptions = TORCH_REFERENCE,
        quant: QuantConfig = UNQUANTIZED,
        tp: TPGroup = SINGLE,
    ) -> None:
        super().__init__()
        self.config = cfg
        self.quant = quant
        self.model = DecoderModel(cfg, dtype, max_positions, kernels, quant, tp)
        tied = self.model.embed_tokens if cfg.tie_word_embeddings else None
        self.lm_head = LMHead(cfg.vocab_size, cfg.hidden_size, dtype, tied, tp)
        self.kv_cache_scales = KVCacheScales()  # filled by load_weights; read by an FP8 pool

    def forward(
        self, token_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        return self.model(token_ids, positions, ctx)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Route HF-named checkpoint tensors to their parameters (a linear layer's go to its
        quant method, by name and shard); every parameter must be set."""
        params = dict(self.named_parameters())
        linears = {n: m for n, m in self.named_modules() if isinstance(m, Linear)}
        moes = {n: m for n, m in self.named_modules() if isinstance(m, SparseMoE)}
        loaded: set[str] = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name or self.kv_cache_scales.add(name, tensor):
                continue
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue
            target = _load_expert(moes, name, tensor) or _load_one(params, linears, name, tensor)
            loaded.add(target)
        in_linears = {
            f"{m}.{p}" for m, layer in linears.items() for p, _ in layer.named_parameters()
        }
        in_linears |= {f"{m}.{p}" for m, moe in moes.items() for p in moe.expert_params()}
        missing = sorted(set(params) - in_linears - loaded)
        missing += [n for layer in linears.values() for n in layer.missing()]
        missing += [f"{m}.{n}" for m, moe in moes.items() for n in moe.missing()]
        if missing:
            raise ModelLoadError(f"checkpoint is missing weights: {', '.join(missing[:5])}")
        for layer in linears.values():
            layer.finish_loading()
        for moe in moes.values():
            moe.finish_loading()

    def init_dummy_weights(self, seed: int) -> None:
        """Random weights of the right shapes (``--load-format dummy``), drawn on the model's
        device: small values keep activations finite; norms stay at one; each linear layer's
        method draws its own (quantized) parameters."""
        device = next(self.parameters()).device
        gen = torch.Generator(device=device).manual_seed(seed)
        for module in self.modules():
            if isinstance(module, (Linear, SparseMoE)):
                module.init_dummy(gen)  # its method draws its own (quantized) stacks
                continue
            for name, param in module.named_parameters(recurse=False):
                if isinstance(module, RMSNorm) or "norm" in name:
                    param.data.fill_(1.0)
                else:
                    param.data.uniform_(-0.02, 0.02, generator=gen)


def _load_expert(moes: dict[str, SparseMoE], name: str, tensor: torch.Tensor) -> str | None:
    """``<moe>.experts.<e>.<proj>.weight`` into its expert stack, and a stacked shared
    expert's ``<moe>.shared_experts.<proj>.weight``; None for any other tensor."""
    moe_name, sep, rest = name.partition(".experts.")
    shared_name, shared_sep, shared_rest = name.partition(".shared_experts.")
    try:
        if sep and moe_name in moes:
            expert, _, proj = rest.removesuffix(".weight").partition(".")
            return f"{moe_name}.{moes[moe_name].load_expert(int(expert), proj, tensor)}"
        moe = moes.get(shared_name) if shared_sep else None
        if moe is not None and moe.shared_expert:
            proj = shared_rest.removesuffix(".weight")
            return f"{shared_name}.{moe.load_shared_expert(proj, tensor)}"
    except ValueError as exc:
        raise ModelLoadError(f"checkpoint weight {name!r}: {exc}") from exc
    return None


def _load_one(
    params: dict[str, nn.Parameter], linears: dict[str, Linear], name: str, tensor: torch.Tensor
) -> str:
    """Copy one checkpoint tensor; returns the name it was loaded under."""
    module_name, _, param_name = name.rpartition(".")
    shard = 0
    for fragment, (merged, index) in STACKED_PARAMS.items():
        if module_name.endswith(f".{fragment}"):
            module_name, shard = module_name[: -len(fragment)] + merged, index
            break
    if module_name in linears:
        linears[module_name].load_shard(param_name, tensor, shard)
        return f"{module_name}.{param_name}"
    if name not in params:
        raise ModelLoadError(f"checkpoint weight {name!r} does not belong to this architecture")
    param = params[name]
    loader = getattr(param, "weight_loader", None)
    if loader is not None:  # a tensor-parallel slice (vocabulary rows)
        loader(tensor)
        return name
    if param.shape != tensor.shape:
        raise ModelLoadError(
            f"checkpoint weight {name!r} has shape {tuple(tensor.shape)}, "
            f"expected {tuple(param.shape)}"
        )
    param.data.copy_(tensor)
    return name
