"""The FP8 (e4m3) linear method: weights stored in float8_e4m3fn with fp32 scales (per
tensor, per output channel or per 128x128 block), activations quantized per token, per token
group or with a static scale, the product on FP8 tensor cores (``kernels.fp8_gemm``).

Steps of one token (``w8a16_max_rows``) run weight-only on the CUDA-core GEMV
(``kernels.word_gemv``), which takes per-tensor, per-channel and 128 x 128 block scales. Other
decode-sized steps (up to ``skinny_max_rows`` tokens) take the swap-AB tensor-core kernel
(``kernels.fp8_skinny_gemm``) on sm_90+, which quantizes activations per 1 x 128 group (inside
its loop up to 32 rows, so with no separate launch), in place of the static or per-token scale
(finer, so no less accurate); cuBLAS is tuned for large M. Both add a bias in their epilogue.

Layer tensors: ``weight [N, K]`` fp8 (the model dtype until an online layer is quantized),
``weight_scale`` (per tensor: one per shard while loading, then one), ``input_scale`` (static
activations: one per shard while loading, then their max).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F
from torch import nn

from kvserve.config import env_switch
from kvserve.errors import ModelLoadError
from kvserve.kernels._triton import hopper_or_newer
from kvserve.kernels.fp8_gemm import (
    blockwise_scaled_mm,
    blockwise_scaled_mm_fits,
    dequantize_fp8_weight,
    fp8_block_gemm,
    fp8_gemm_reference,
    scaled_mm,
)
from kvserve.kernels.fp8_quant import FP8, dequantize_fp8_activation, quantize_fp8
from kvserve.kernels.fp8_skinny_gemm import DEFAULT_ROWS as SKINNY_DEFAULT_ROWS
from kvserve.kernels.fp8_skinny_gemm import MOST_ROWS as SKINNY_ROWS
from kvserve.kernels.fp8_skinny_gemm import QUANTIZE_FIRST_ABOVE, fp8_skinny_linear
from kvserve.kernels.fp8_skinny_gemm import X_GROUP as SKINNY_X_GROUP
from kvserve.kernels.word_gemv import GEMV_ROWS, fp8_gemv, gated_fits
from kvserve.quant.fp8_activation import Fp8Activation, Fp8InputScheme
from kvserve.quant.fp8_config import Fp8Spec, fp8_spec
from kvserve.quant.fp8_weights import quantize_weight, requantize_to_max
from kvserve.quant.method import (
    copy_checked,
    refuses_permuted_input,
    rows_from_env,
    shard_rows,
    unknown_param,
)
from kvserve.quant.schemes import QuantConfig

if TYPE_CHECKING:
    from kvserve.layers.linear import Linear
    from kvserve.quant.permuted_activation import PermutedActivation

ZERO_POINTS = ("weight_zero_point", "input_zero_point")
DUMMY_INPUT_SCALE = 0.02  # static activations up to ~9 in a random model


W8A16_ROWS_ENV = "KVSERVE_FP8_W8A16_ROWS"
KernelPath = Literal["dequantized", "gemv", "skinny", "w8a8"]  # the kernels a step can take (_path)


@functools.cache
def w8a16_max_rows() -> int:
    """Steps of at most this many tokens (0-4) run FP8 weights weight-only on the CUDA-core
    GEMV, ``kernels/word_gemv.py`` (``KVSERVE_FP8_W8A16_ROWS``). The default, 1, is what the
    H200 measured: a batch-1 step took 3.96 instead of 5.21 ms on the GEMV, a batch-4 step 5.58
    instead of 4.81 (lowbit_decode_h200_gemv_2026-12-01.json)."""
    return rows_from_env(W8A16_ROWS_ENV, 1, GEMV_ROWS)


SKINNY_ROWS_ENV = "KVSERVE_FP8_SKINNY_ROWS"
SILU_QUANT_ENV = "KVSERVE_FP8_SILU_QUANT"
NORM_QUANT_ENV = "KVSERVE_FP8_NORM_QUANT"
BLOCK_CUBLAS_ROWS_ENV = "KVSERVE_FP8_BLOCK_CUBLAS_ROWS"
SKINNY_ROW_SCALE_ENV = "KVSERVE_FP8_SKINNY_ROW_SCALE"
MOST_STEP_ROWS = 1 << 20  # the largest row threshold a setting takes
DECODE_SCALE_BLOCK = (128, 128)  # block-scaled weights the decode kernels take


@functools.cache
def skinny_max_rows() -> int:
    """Steps of at most this many tokens (0-512; 64 by default, the kernel's one row tile) take
    ``fp8_skinny_linear`` when the GEMV does not (``KVSERVE_FP8_SKINNY_ROWS``)."""
    return rows_from_env(SKINNY_ROWS_ENV, SKINNY_DEFAULT_ROWS, SKINNY_ROWS)


def make_method(config: QuantConfig) -> Fp8LinearMethod:
    return Fp8LinearMethod(fp8_spec(config))


def _param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)


class Fp8LinearMethod:
    def __init__(self, spec: Fp8Spec) -> None:
        self.spec = spec

    # -- storage ------------------------------------------------------------------------------
    def create_weights(self, layer: Linear, dtype: torch.dtype) -> None:
        n, k, spec = layer.out_features, layer.in_features, self.spec
        shards = len(layer.shard_sizes)
        layer.weight = _param(torch.empty(n, k, dtype=dtype if spec.online else FP8))
        if spec.online:
            return
        if spec.weight == "tensor":
            layer.weight_scale = _param(torch.ones(shards))
        elif spec.weight == "channel":
            layer.weight_scale = _param(torch.ones(n))
        else:
            bn, bk = spec.block
            if any(o % bn for o in layer.shard_offsets):
                raise ModelLoadError(
                    f"{layer.prefix}: shards {layer.shard_sizes} do not start on {bn}-row "
                    "weight-scale blocks"
                )
            if k % bk:
                raise ModelLoadError(f"{layer.prefix}: {k} input features are not {bk}-groups")
            layer.weight_scale = _param(torch.ones(-(-n // bn), k // bk))
        if spec.activation == "static":
            layer.input_scale = _param(torch.ones(shards))

    def checkpoint_params(self, layer: Linear) -> tuple[str, ...]:
        if self.spec.online:
            return ("weight",)
        static = ("input_scale",) if self.spec.activation == "static" else ()
        return ("weight", self.spec.scale_name, *static)

    # -- loading ------------------------------------------------------------------------------
    def load_param(self, layer: Linear, name: str, loaded: torch.Tensor, shard: int) -> None:
        what = f"{layer.prefix}.{name}[{shard}]"
        if name == "weight":
            copy_checked(layer.weight.data[shard_rows(layer, shard)], loaded, what)
        elif name == self.spec.scale_name and not self.spec.online:
            self._load_weight_scale(layer, loaded.float(), shard, what)
        elif name == "input_scale":
            if self.spec.activation == "static":
                copy_checked(layer.input_scale.data[shard : shard + 1], loaded.reshape(1), what)
            # dynamic schemes compute their own; a calibrated scale some writers add is unused
        elif name in ZERO_POINTS:
            if loaded.float().abs().max() != 0:
                raise ModelLoadError(f"{what}: fp8 is symmetric, but the zero point is not 0")
        else:
            raise unknown_param(layer, name, "fp8")

    def _load_weight_scale(
        self, layer: Linear, loaded: torch.Tensor, shard: int, what: str
    ) -> None:
        scale = layer.weight_scale.data
        if self.spec.weight == "tensor":
            if loaded.numel() != 1:
                raise ModelLoadError(f"{what}: per-tensor scale has {loaded.numel()} values")
            scale[shard] = loaded.reshape(())
        elif self.spec.weight == "channel":
            copy_checked(scale[shard_rows(layer, shard)], loaded.reshape(-1), what)
        else:
            bn = self.spec.block[0]
            first = layer.shard_offsets[shard] // bn
            copy_checked(scale[first : first + loaded.shape[0]], loaded, what)

    def process_after_loading(self, layer: Linear) -> None:
        spec = self.spec
        if spec.online:
            q, scale = quantize_weight(layer.weight.data, "channel")
            layer.weight = _param(q)
            layer.weight_scale = _param(scale)
            return
        if spec.weight == "tensor" and layer.weight_scale.numel() > 1:
            top = requantize_to_max(
                layer.weight.data, layer.weight_scale.data, layer.shard_offsets, layer.shard_sizes
            )
            layer.weight_scale = _param(top)
        if spec.activation == "static" and layer.input_scale.numel() > 1:
            layer.input_scale = _param(layer.input_scale.data.max().reshape(1))

    def init_dummy(self, layer: Linear, gen: torch.Generator) -> None:
        spec = self.spec
        w = torch.empty(layer.weight.shape, device=layer.weight.device)
        w.uniform_(-0.02, 0.02, generator=gen)
        if spec.online:
            layer.weight.data.copy_(w)
            return
        q, scale = quantize_weight(w, spec.weight, spec.block)
        layer.weight.data.copy_(q)
        if spec.weight == "tensor":  # one scale for all shards: nothing left to requantize
            layer.weight_scale = _param(scale)
        else:
            layer.weight_scale.data.copy_(scale)
        if spec.activation == "static":
            layer.input_scale = _param(torch.full((1,), DUMMY_INPUT_SCALE, device=w.device))

    # -- compute ------------------------------------------------------------------------------
    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        shape = x.shape
        y = self._matmul(layer, x.reshape(-1, shape[-1]), bias)
        return y.view(*shape[:-1], y.shape[-1])

    def apply_gated(self, layer: Linear, x: torch.Tensor) -> torch.Tensor | None:
        spec = self.spec
        x2 = x.reshape(-1, x.shape[-1])
        fits = gated_fits(layer.out_features, spec.block[0] if spec.block else 0)
        if not fits or _path(spec, x2) != "gemv":
            return None
        w, ws = layer.weight, layer.weight_scale
        y = fp8_gemv(x2, w, ws, block=spec.block, pdl=layer.launch_pdl, gated=True)
        return y.view(*x.shape[:-1], y.shape[-1])

    def apply_after_silu_mul(
        self, layer: Linear, gate_up: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor | None:
        """``silu(gate) * up @ W.T + bias`` where this step quantizes x by its own kernel
        (``_quantizes_first``: cuBLAS or the block GEMM with a per-token, per-group or static
        scale; the tensor-core kernel past ``QUANTIZE_FIRST_ABOVE`` rows): that kernel takes the
        gate and up and applies the SiLU-mul (one launch in place of two, the same bits). None
        elsewhere, on CPU (its reference SiLU-mul rounds in x's dtype, the quantization's in
        fp32: not the same bits), and with ``KVSERVE_FP8_SILU_QUANT`` at 0."""
        spec, x = self.spec, gate_up.reshape(-1, gate_up.shape[-1])
        k = x.shape[-1] // 2
        if not silu_quant_enabled() or x.device.type != "cuda":
            return None
        path = _path(spec, x)
        if not _quantizes_first(spec, path, x.shape[0], k):
            return None
        if path == "skinny":
            w, ws = layer.weight, layer.weight_scale
            y = fp8_skinny_linear(
                x, w, ws, bias, block=spec.block, pdl=layer.launch_pdl, gated=True,
                x_row_scale=skinny_row_scale(spec),
            )  # fmt: skip
        else:
            y = self._matmul_w8a8(layer, *self._quantize(layer, x, gated=True), x.dtype)
            y = y if bias is None else y + bias
        return y.view(*gate_up.shape[:-1], y.shape[-1])

    def fp8_input_scheme(self, layer: Linear, x: torch.Tensor) -> Fp8InputScheme | None:
        """How a step of ``x`` (the rows, device and dtype of this layer's input) would have x
        quantized by a kernel of its own, for the kernel that produces x to do instead
        (``KVSERVE_FP8_NORM_QUANT``): groups of the tensor-core kernel's K step past
        ``QUANTIZE_FIRST_ABOVE`` rows, else the scheme's per-token, per-group or static scale.
        None where x stays 16-bit (the GEMV, the kernel's in-loop quantization) or needs its
        whole-tensor amax first, and with the setting at 0."""
        spec = self.spec
        k = x.shape[-1]
        if not norm_quant_enabled():
            return None
        path = _path(spec, x)
        if not _quantizes_first(spec, path, x.shape[0], k):
            return None
        if path == "skinny":
            return Fp8InputScheme(None if skinny_row_scale(spec) else SKINNY_X_GROUP)
        static = layer.input_scale if spec.activation == "static" else None
        return Fp8InputScheme(spec.act_group, static, self._block_cublas(layer, x.shape[0]))

    def apply_fp8(self, layer: Linear, x: Fp8Activation, bias: torch.Tensor | None) -> torch.Tensor:
        """``x @ W.T + bias`` for an x quantized as ``fp8_input_scheme`` asked."""
        spec, w, ws = self.spec, layer.weight, layer.weight_scale
        if _path(spec, x.q, x.dtype) == "skinny":
            return fp8_skinny_linear(
                x.q, w, ws, bias, block=spec.block, pdl=layer.launch_pdl, x_scales=x.scales,
                out_dtype=x.dtype,
            )  # fmt: skip
        y = self._matmul_w8a8(layer, x.q, x.scales, x.dtype)
        return y if bias is None else y + bias

    def step_order(self, layer: Linear, x: torch.Tensor) -> None:
        return None

    def apply_permuted(
        self, layer: Linear, x: PermutedActivation, bias: torch.Tensor | None
    ) -> torch.Tensor:
        raise TypeError(refuses_permuted_input(self))

    def _matmul(
        self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        spec, w, ws = self.spec, layer.weight, layer.weight_scale
        path = _path(spec, x)
        if path == "dequantized":
            return F.linear(x, dequantize_fp8_weight(w, ws, spec.block).to(x.dtype), bias)
        # The decode kernels add the bias in their epilogue (GLM-4.5's q/k/v): no add kernel
        if path == "gemv":
            return fp8_gemv(x, w, ws, bias, block=spec.block, pdl=layer.launch_pdl)
        if path == "skinny":
            return fp8_skinny_linear(
                x, w, ws, bias, block=spec.block, pdl=layer.launch_pdl,
                x_row_scale=skinny_row_scale(spec),
            )  # fmt: skip
        y = self._matmul_w8a8(layer, *self._quantize(layer, x), x.dtype)
        return y if bias is None else y + bias

    def _quantize(
        self, layer: Linear, x: torch.Tensor, gated: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x's e4m3 values and scales for cuBLAS or the block GEMM, by their own kernel.
        ``gated``: x is a gate and up, and the quantization applies their SiLU-mul."""
        spec = self.spec
        static = layer.input_scale if spec.activation == "static" else None
        if spec.activation == "tensor":
            static = (x.abs().amax().float() / 448.0).clamp(min=1e-12 / 448.0).reshape(1)
        # the scales M-major where cuBLASLt takes the step, as it reads them
        rows_first = self._block_cublas(layer, x.shape[0])
        return quantize_fp8(x, spec.act_group, static, gated=gated, scales_m_major=rows_first)

    def _block_cublas(self, layer: Linear, rows: int) -> bool:
        """Whether this layer's W8A8 step of ``rows`` tokens runs cuBLASLt's block-scaled GEMM
        (``block_cublas_min_rows``), which reads x's scales M-major."""
        least = block_cublas_min_rows()
        return self.spec.weight == "block" and 0 < least <= rows and _cublas_takes(layer, self.spec)

    def _matmul_w8a8(
        self, layer: Linear, xq: torch.Tensor, xs: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        """Quantized x (``_quantize``'s) @ W.T on cuBLAS (or the block GEMM), in ``dtype``."""
        spec, w, ws = self.spec, layer.weight, layer.weight_scale
        if xq.device.type == "cpu":
            return (dequantize_fp8_activation(xq, xs) @ _dequantized(layer, spec).T).to(dtype)
        if not _tensor_core_shapes(layer):
            return fp8_gemm_reference(xq, xs, w, ws, dtype, spec.block)
        if self._block_cublas(layer, xq.shape[0]):
            return blockwise_scaled_mm(xq, xs, w, ws, dtype)
        if spec.weight == "block":
            return fp8_block_gemm(xq, xs, w, ws, spec.block, dtype)
        return scaled_mm(xq, xs, w, ws, dtype)


def _dequantized(layer: Linear, spec: Fp8Spec) -> torch.Tensor:
    """The CPU reference's fp32 weight, dequantized once and kept beside the FP8 one (the CPU
    path is for correctness; this keeps it from dequantizing every layer on every step)."""
    cached = layer.__dict__.get("_fp8_dequantized")
    if cached is None:
        cached = dequantize_fp8_weight(layer.weight, layer.weight_scale, spec.block)
        layer.__dict__["_fp8_dequantized"] = cached
    return cached


def _cublas_takes(layer: Linear, spec: Fp8Spec) -> bool:
    """Whether cuBLASLt's block-scaled GEMM takes this layer's weight, decided once per layer
    (the weight's shape and device do not change; a step asks up to three times)."""
    fits = layer.__dict__.get("_fp8_block_cublas_fits")
    if fits is None:
        fits = _tensor_core_shapes(layer) and blockwise_scaled_mm_fits(layer.weight, spec.block)
        layer.__dict__["_fp8_block_cublas_fits"] = fits
    return fits


def _decode_blocks_fit(spec: Fp8Spec) -> bool:
    """Per-tensor or per-channel scales, or the 128 x 128 blocks the decode kernels take."""
    return spec.block is None or spec.block == DECODE_SCALE_BLOCK


def _path(spec: Fp8Spec, x: torch.Tensor, dtype: torch.dtype | None = None) -> KernelPath:
    """Which kernel a step of ``x``'s rows takes (``dtype``: x's own before it was quantized):
    - "dequantized": weight-only checkpoints (no activation scheme), the weight dequantized;
    - "gemv": steps of a few tokens on the CUDA-core GEMV, for per-tensor or per-channel
      scales and the 128 x 128 blocks of the DeepSeek-V3 / Qwen3-FP8 / GLM-4.5-FP8 releases.
      On the H200, at one token, GLM-4.5-Air's block-scaled projections took 22.2 / 19.1 /
      7.3 / 5.8 us on it against 23.4 / 19.3 / 9.4 / 6.8 on the tensor-core kernel
      (fp8_gemv_h200_glm_block), and its batch-1 decode 165 against 162 tok/s
      (moe_decode_h200_s35_glm_fp8_head{,_tc});
    - "skinny": other decode steps, on the tensor-core kernel on sm_90+ (measured and tested
      on wgmma only), with any weight scales its tiles fit;
    - "w8a8": x quantized by its own kernel, then cuBLAS or the block GEMM."""
    if spec.activation == "none":
        return "dequantized"
    rows, dtype = x.shape[0], dtype or x.dtype
    decode = (
        _decode_blocks_fit(spec) and x.device.type == "cuda" and rows > 0
        and dtype in (torch.bfloat16, torch.float16)
    )  # fmt: skip
    if decode and rows <= w8a16_max_rows():
        return "gemv"
    if decode and rows <= skinny_max_rows() and hopper_or_newer(x.device):
        return "skinny"
    return "w8a8"


def _quantizes_first(spec: Fp8Spec, path: KernelPath, rows: int, k: int) -> bool:
    """Whether a step of ``rows`` on ``path`` (``_path``'s; ``k`` columns to quantize) quantizes
    x by a kernel of its own before the GEMM: the tensor-core kernel past
    ``QUANTIZE_FIRST_ABOVE`` rows (per token or per 128-column group: ``skinny_row_scale``),
    cuBLAS and the block GEMMs with a scale that kernel computes per row or group or takes as
    given (a dynamic per-tensor scale needs x's whole amax first)."""
    if path == "skinny":
        return rows > QUANTIZE_FIRST_ABOVE and k % SKINNY_X_GROUP == 0
    return path == "w8a8" and rows > 0 and spec.activation != "tensor"


@functools.cache
def silu_quant_enabled() -> bool:
    """``KVSERVE_FP8_SILU_QUANT``: 1 (the default) has an FP8 down projection whose step
    quantizes x by its own kernel take the gate/up output and apply the SiLU-mul in that kernel
    (``apply_after_silu_mul``); 0 keeps the SiLU-mul kernel. On the H200, with
    ``KVSERVE_FP8_NORM_QUANT`` (alternating runs, one machine), Llama-3-8B decode at batch 64 /
    256: per-channel +1.5% / +1.2%, 128 x 128 blocks +2.6% / +3.1%; offline +0.8%
    (env_ab_h200_s56_fp8_{quant,offline}_fusion_2026-12-05.json)."""
    return env_switch(SILU_QUANT_ENV, default=True)


@functools.cache
def norm_quant_enabled() -> bool:
    """``KVSERVE_FP8_NORM_QUANT``: 1 (the default) has the RMSNorm before an FP8 q/k/v or
    gate/up layer write e4m3 and the scales that layer's step wants (``fp8_input_scheme``), in
    place of a 16-bit output and a quantization kernel (the same bits); 0 keeps the two. Timed
    with ``KVSERVE_FP8_SILU_QUANT``."""
    return env_switch(NORM_QUANT_ENV, default=True)


@functools.cache
def skinny_row_scale_enabled() -> bool:
    """``KVSERVE_FP8_SKINNY_ROW_SCALE``: 1, the default, has per-channel and per-tensor FP8
    layers' steps that the tensor-core kernel takes with x quantized first (33-64 tokens,
    ``fp8_skinny_gemm``) quantize x per token, the layers' own activation scheme and cuBLAS's
    past 64 tokens, in place of per 128-column group: its K loop then chains the MMAs into one
    accumulator and keeps one in flight (sm_90 TTGIR: the wgmma waits with one pending and no
    scale load is left in the loop), where one scale a K step waits for each product and loads
    its scales in the loop. +6% decode at batch 48 and 64 on the H200 (s59); 0 keeps the
    groups."""
    return env_switch(SKINNY_ROW_SCALE_ENV, default=True)


def skinny_row_scale(spec: Fp8Spec) -> bool:
    """Whether the tensor-core kernel's x takes one scale a row for this layer's weights
    (``skinny_row_scale_enabled``; blocks of W need a scale a K step)."""
    return spec.block is None and skinny_row_scale_enabled()


@functools.cache
def block_cublas_min_rows() -> int:
    """``KVSERVE_FP8_BLOCK_CUBLAS_ROWS``: W8A8 steps (past the decode kernels' 64 tokens, and
    prefill) of at least this many tokens of a 128 x 128 block-scaled FP8 layer run on
    cuBLASLt's block-scaled GEMM where it takes the shape (``blockwise_scaled_mm_fits``: sm_90,
    N whole blocks, K a multiple of 512), in place of the Triton block GEMM (``fp8_block_gemm``).
    1, the default, is every such step: on the H200 (s59) cuBLASLt ran Llama-3-8B's layers at
    128 to 8192 rows in 36-63% of the Triton kernel's time, with the same error, and took the
    engine's decode at batch 128 / 256 from 10,490 / 14,289 to 14,256 / 18,544 tok/s, an 8 x 1K
    prefill from 34,240 to 56,493. 0 keeps the Triton block GEMM."""
    return rows_from_env(BLOCK_CUBLAS_ROWS_ENV, 1, MOST_STEP_ROWS)


def _tensor_core_shapes(layer: Linear) -> bool:
    """cuBLASLt FP8 needs K and N multiples of 16."""
    n, k = layer.weight.shape
    return k % 16 == 0 and n % 16 == 0
