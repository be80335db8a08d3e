"""GGUF tensors -> HF-named float32 tensors: dequantized, llama.cpp's Q/K permutation undone."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from kvserve.config import ModelConfig
from kvserve.errors import ModelLoadError
from kvserve.loader.files import one_line
from kvserve.loader.gguf_names import IGNORED_GGUF_TENSORS, block_index, hf_name
from kvserve.loader.gguf_reader import gguf_field

SUPPORTED_GGUF_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")


def iter_gguf_weights(
    reader: Any, config: ModelConfig, path: str
) -> Iterator[tuple[str, torch.Tensor]]:
    # llama.cpp permutes Q/K rows for its ``llama`` arch (Llama, and Mixtral: llama with experts)
    unpermute = gguf_field(reader, "general.architecture") == "llama"
    for tensor in reader.tensors:
        if tensor.name in IGNORED_GGUF_TENSORS or _past_the_decoder(tensor.name, config):
            continue
        name = hf_name(tensor.name)
        if name is None:
            raise ModelLoadError(f"{path}: unexpected GGUF tensor {tensor.name!r}")
        array = _dequantize(tensor, path)
        if unpermute and name.endswith("self_attn.q_proj.weight"):
            array = unpermute_rope_rows(array, config.num_heads)
        elif unpermute and name.endswith("self_attn.k_proj.weight"):
            array = unpermute_rope_rows(array, config.num_kv_heads)
        if ".mlp.experts." in name:
            yield from _per_expert(name, array)
            continue
        yield name, torch.from_numpy(np.require(array, requirements=("C", "W")))


def _past_the_decoder(gguf_name: str, config: ModelConfig) -> bool:
    """A block past the decoder's layers: GLM-4.5's multi-token-prediction layers
    (``blk.<n>.nextn.*`` and that block's attention and experts), unused by decoding."""
    block = block_index(gguf_name)
    return block is not None and block >= config.num_layers


def _per_expert(name: str, stacked: np.ndarray) -> Iterator[tuple[str, torch.Tensor]]:
    """llama.cpp stacks experts (``ffn_gate_exps`` [E, I, H]); HF names them one by one."""
    prefix, _, proj = name.partition(".experts.")
    for expert, array in enumerate(stacked):
        tensor = torch.from_numpy(np.require(array, requirements=("C", "W")))
        yield f"{prefix}.experts.{expert}.{proj}", tensor


def unpermute_rope_rows(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation.

    HF checkpoints rotate pairs (i, i + head_dim/2) ("rotate_half"); llama.cpp's rope rotates
    adjacent pairs (2i, 2i+1), so its converter reorders each head's rows from
    [x0 .. x_{d/2-1}, y0 .. y_{d/2-1}] to [x0, y0, x1, y1, ...]:
    ``w.reshape(n_head, 2, d/2, in).swapaxes(1, 2)``. The inverse reads rows as (d/2, 2) pairs.
    """
    rows = weight.shape[0]
    head_dim = rows // n_head
    return (
        weight.reshape(n_head, head_dim // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def _dequantize(tensor: Any, path: str) -> np.ndarray:
    from gguf.quants import dequantize

    kind = tensor.tensor_type.name
    if kind not in SUPPORTED_GGUF_TYPES:
        raise ModelLoadError(
            f"{path}: tensor {tensor.name!r} has GGUF type {kind}, which is not supported "
            f"(supported: {', '.join(SUPPORTED_GGUF_TYPES)})"
        )
    try:
        array = dequantize(tensor.data, tensor.tensor_type)
    except Exception as exc:  # a short or corrupt data block
        raise ModelLoadError(
            f"{path}: cannot read tensor {tensor.name!r}: {one_line(exc)}"
        ) from exc
    # GGUF lists dims in ggml order (innermost first); numpy's shape is the reverse: (out, in).
    shape = tuple(int(d) for d in reversed(tensor.shape))
    return array.astype(np.float32, copy=False).reshape(shape)
