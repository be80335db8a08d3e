"""Tensor parallelism on two GPUs (NCCL, CUDA graphs capturing the all-reduces): a random
Llama-3-8B-shaped checkpoint cut to 2 layers gives the same greedy tokens at TP=2 as at TP=1,
near-ties (top-2 margin < 0.05) tolerated and counted, through the CPU tests' workload
(chunked prefill, prefix-cache hits, preemption, overlap scheduling). Skipped below 2 GPUs."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
import torch

from benchmarks.random_checkpoint import llama_shards, random_tensor
from tests.distributed.tp_scenario import compare, run_workload

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs"),
]

LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256,
    "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "max_position_embeddings": 8192, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "bos_token_id": 128000, "eos_token_id": 128001,
}  # fmt: skip


def write_random_checkpoint(path: Path, config: dict, num_layers: int, seed: int = 0) -> str:
    """config.json + one safetensors file of N(0, 0.02) bf16 weights (norms at 1)."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    cfg = {**config, "num_hidden_layers": num_layers}
    (path / "config.json").write_text(json.dumps(cfg))
    gen = torch.Generator(device="cuda").manual_seed(seed)
    tensors = {name: random_tensor(shape, "cuda", gen)
               for shard in llama_shards(cfg) for name, shape in shard.items()}  # fmt: skip
    save_file(tensors, str(path / "model.safetensors"))
    return str(path)


def test_llama3_8b_shape_tp2_matches_tp1(tmp_path: Path) -> None:
    model = write_random_checkpoint(tmp_path / "llama3-8b-2l", LLAMA3_8B, num_layers=2)
    gpu = {"device": "cuda", "dtype": "bfloat16", "mem_fraction_static": 0.5}
    reference = run_workload(model, 1, max_tokens=16, **gpu)
    gc.collect()
    torch.cuda.empty_cache()
    parallel = run_workload(model, 2, max_tokens=16, overlap_schedule=True, **gpu)
    ties, diffs = compare(reference, parallel)
    print(f"TP2 vs TP1: {ties} near-ties over {len(reference.tokens)} requests")
    assert diffs == []
    assert parallel.preemptions > 0 and parallel.prefix_hits > 0
