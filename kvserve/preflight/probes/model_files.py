"""Model facts from the files: an HF directory (config.json + safetensors headers) or a GGUF.

Reads metadata only: safetensors headers (8-byte little-endian length, then JSON) and GGUF
key/values; tensor data is never loaded. ``gguf`` is imported only for a GGUF path.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from kvserve.gguf_architectures import hf_architecture
from kvserve.hf_sliding_window import sliding_window_of
from kvserve.preflight.facts import ModelFacts

_MAX_HEADER = 100 * 2**20  # a larger safetensors header means a corrupt file


def safetensors_sizes(path: Path) -> dict[str, int]:
    """Tensor name -> data bytes, from a safetensors header. Raises OSError/ValueError if bad."""
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError("file shorter than its 8-byte header length")
        (length,) = struct.unpack("<Q", head)
        if length > _MAX_HEADER:
            raise ValueError(f"header length {length} is not plausible")
        header = json.loads(f.read(length))
    return {
        name: info["data_offsets"][1] - info["data_offsets"][0]
        for name, info in header.items()
        if name != "__metadata__"
    }


def _shards(directory: Path, facts: ModelFacts) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError) as exc:
            facts.problems.append(f"{index.name} is unreadable: {exc}")
            return []
        return [directory / n for n in names]
    return sorted(directory.glob("*.safetensors"))


def _apply_hf_config(cfg: dict[str, Any], facts: ModelFacts) -> None:
    text = cfg.get("text_config") if "num_hidden_layers" not in cfg else None
    shape = text if isinstance(text, dict) else cfg
    archs = cfg.get("architectures") or []
    facts.architecture = archs[0] if archs else None
    facts.num_layers = shape.get("num_hidden_layers")
    facts.num_heads = shape.get("num_attention_heads")
    facts.num_kv_heads = shape.get("num_key_value_heads") or facts.num_heads
    facts.hidden_size = shape.get("hidden_size")
    facts.head_dim = shape.get("head_dim")
    facts.max_context = shape.get("max_position_embeddings")
    window = sliding_window_of(shape, facts.architecture or "")
    if window and facts.max_context and window < facts.max_context:
        facts.max_context = window  # the engine serves a windowed model its window at most
    facts.dtype = cfg.get("torch_dtype") or cfg.get("dtype")
    facts.quantization = cfg.get("quantization_config")
    facts.num_experts = (
        shape.get("num_experts") or shape.get("n_routed_experts") or shape.get("num_local_experts")
    )
    facts.experts_per_token = shape.get("num_experts_per_tok")
    facts.expert_intermediate_size = shape.get("moe_intermediate_size") or (
        shape.get("intermediate_size") if shape.get("num_local_experts") else None
    )  # Mixtral's experts are intermediate_size wide


def read_hf_dir(directory: Path) -> ModelFacts:
    facts = ModelFacts(str(directory), kind="hf")
    config = directory / "config.json"
    try:
        _apply_hf_config(json.loads(config.read_text()), facts)
    except FileNotFoundError:
        facts.problems.append(f"no config.json in {directory}")
    except (OSError, ValueError) as exc:
        facts.problems.append(f"config.json is unreadable: {exc}")
    shards = _shards(directory, facts)
    if not shards:
        facts.problems.append(f"no *.safetensors weights in {directory}")
    total = 0
    for shard in shards:
        try:
            sizes = safetensors_sizes(shard)
            total += sum(sizes.values())
            facts.expert_bytes += sum(v for k, v in sizes.items() if ".experts." in k)
            facts.files += 1
        except FileNotFoundError:
            facts.problems.append(f"missing shard {shard.name}")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            facts.problems.append(f"{shard.name} is unreadable: {exc}")
    facts.weight_bytes = total if shards and facts.files == len(shards) else None
    return facts


def _field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def read_gguf(path: Path) -> ModelFacts:
    facts = ModelFacts(str(path), kind="gguf")
    try:
        from gguf import GGUFReader, LlamaFileType

        reader = GGUFReader(path)
    except ImportError as exc:
        facts.problems.append(f"the gguf package is needed to read {path.name} ({exc})")
        return facts
    except (OSError, ValueError) as exc:
        facts.problems.append(f"{path.name} is not a readable GGUF file: {exc}")
        return facts
    arch = _field(reader, "general.architecture")
    facts.files = 1
    experts = _field(reader, f"{arch}.expert_count")
    facts.architecture = hf_architecture(arch, experts) or f"gguf:{arch}"
    blocks = _field(reader, f"{arch}.block_count")
    # GLM-4.5's multi-token-prediction blocks are counted in block_count; serving skips them
    nextn = _field(reader, f"{arch}.nextn_predict_layers") or 0
    facts.num_layers = None if blocks is None else blocks - nextn
    facts.num_heads = _field(reader, f"{arch}.attention.head_count")
    facts.num_kv_heads = _field(reader, f"{arch}.attention.head_count_kv") or facts.num_heads
    facts.hidden_size = _field(reader, f"{arch}.embedding_length")
    facts.head_dim = _field(reader, f"{arch}.attention.key_length")
    facts.max_context = _field(reader, f"{arch}.context_length")
    file_type = _field(reader, "general.file_type")
    facts.gguf_file_type = None if file_type is None else LlamaFileType(file_type).name
    facts.weight_bytes = path.stat().st_size
    _apply_gguf_experts(reader, arch, facts)
    return facts


def _apply_gguf_experts(reader: Any, arch: str, facts: ModelFacts) -> None:
    """llama.cpp stacks each layer's routed experts in ``blk.<i>.ffn_*_exps``: their bytes in
    the decoder's blocks, and how many of ``expert_count`` a token reads."""
    facts.num_experts = _field(reader, f"{arch}.expert_count")
    facts.experts_per_token = _field(reader, f"{arch}.expert_used_count")
    facts.expert_intermediate_size = _field(reader, f"{arch}.expert_feed_forward_length")
    if facts.architecture == "MixtralForCausalLM":  # experts as wide as the dense FFN
        facts.expert_intermediate_size = _field(reader, f"{arch}.feed_forward_length")
    layers = facts.num_layers or 0
    facts.expert_bytes = sum(
        int(t.n_bytes)
        for t in reader.tensors
        if "_exps." in t.name and int(t.name.split(".")[1]) < layers  # blk.<i>.ffn_*_exps
    )


def probe_model(path: Path) -> ModelFacts:
    if not path.exists():
        return ModelFacts(str(path), problems=[f"{path} does not exist"])
    if path.is_dir():
        return read_hf_dir(path)
    if path.suffix.lower() == ".gguf":
        return read_gguf(path)
    return ModelFacts(str(path), problems=[f"{path} is neither a model directory nor a .gguf file"])
