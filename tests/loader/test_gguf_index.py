"""The cached GGUF index: a model opened from it has the config, EOS ids and weights of one
opened through gguf's reader, without parsing the file again; a damaged entry is parsed again;
an empty KVSERVE_CACHE_DIR turns it off."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from model_factory import MOE_TINY, make_tiny_gguf

from kvserve.loader import gguf_index
from kvserve.loader.gguf_index import GGUFIndex, open_gguf_index
from kvserve.loader.gguf_reader import open_gguf
from kvserve.loader.model_source import open_model_source


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("KVSERVE_CACHE_DIR", str(root))
    _forget()
    yield root
    _forget()


def _forget() -> None:
    """Drop the in-process caches, as a new process starts without them."""
    open_gguf_index.cache_clear()
    open_gguf.cache_clear()


@pytest.fixture
def tiny_path(tmp_path: Path) -> str:
    """A small GGUF for the cache's own behaviour: gguf's reader parses it in milliseconds,
    where the bundled model's 49K-token vocabulary takes it 6 s a parse."""
    path, _ = make_tiny_gguf("Qwen3ForCausalLM", tmp_path, "Q8_0")
    return str(path)


def _entry(root: Path) -> Path:
    (entry,) = (root / "gguf-index").iterdir()
    return entry


def _assert_same_model(path: str) -> None:
    first = open_model_source(path)  # parsed by GGUFReader, entry written
    first_weights = dict(first.weights())
    _forget()
    second = open_model_source(path)
    assert isinstance(open_gguf_index(path), GGUFIndex)
    assert second.config == first.config
    assert second.generation_defaults == first.generation_defaults
    second_weights = dict(second.weights())
    assert set(second_weights) == set(first_weights)
    for name, weight in first_weights.items():
        assert torch.equal(second_weights[name], weight), name


def test_bundled_model_from_the_index_equals_the_parsed_one(cache: Path, bundled_path: str) -> None:
    _assert_same_model(bundled_path)


@pytest.mark.parametrize("tensor_type", ["Q8_0", "BF16", "F16"])
def test_tiny_models_from_the_index_equal_the_parsed_ones(
    cache: Path, tmp_path: Path, tensor_type: str
) -> None:
    path, _ = make_tiny_gguf("Qwen3ForCausalLM", tmp_path, tensor_type)
    _assert_same_model(str(path))


def test_moe_experts_from_the_index(cache: Path, tmp_path: Path) -> None:
    overrides = {**MOE_TINY["Qwen3MoeForCausalLM"], "decoder_sparse_step": 1}
    path, _ = make_tiny_gguf("Qwen3MoeForCausalLM", tmp_path, "F32", **overrides)
    _assert_same_model(str(path))


@pytest.mark.parametrize("tensor_type", ["Q4_K", "Q6_K"])
def test_k_quant_views_equal_the_readers(cache: Path, tmp_path: Path, tensor_type: str) -> None:
    """The index's data views (gguf's byte shapes) are the reader's, byte for byte."""
    kind = gguf.GGMLQuantizationType[tensor_type]
    block, type_size = gguf.GGML_QUANT_SIZES[kind]
    raw = np.random.default_rng(0).integers(0, 256, size=(8, 2 * type_size), dtype=np.uint8)
    path = str(tmp_path / "k.gguf")
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tensor("blk.0.ffn_up.weight", raw, raw_dtype=kind)
    writer.add_tensor("blk.0.ffn_norm.weight", np.arange(2 * block, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader = open_gguf_index(path)  # the parse, which writes the entry
    _forget()
    index = open_gguf_index(path)
    assert isinstance(index, GGUFIndex)
    for ours, theirs in zip(index.tensors, reader.tensors, strict=True):
        assert (ours.name, ours.tensor_type) == (theirs.name, theirs.tensor_type)
        assert ours.shape == tuple(int(d) for d in theirs.shape)
        assert ours.data.dtype == theirs.data.dtype and ours.data.shape == theirs.data.shape
        assert np.array_equal(ours.data, theirs.data)


def test_a_second_open_does_not_parse_the_file(
    cache: Path, tiny_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = open_model_source(tiny_path).config
    _forget()

    def no_parse(*args: object, **kwargs: object) -> None:
        raise AssertionError("GGUFReader called although the index is cached")

    monkeypatch.setattr(gguf, "GGUFReader", no_parse)
    assert open_model_source(tiny_path).config == config


def test_a_damaged_entry_is_parsed_again(cache: Path, tiny_path: str) -> None:
    config = open_model_source(tiny_path).config
    _entry(cache).write_text("{not json")
    _forget()
    assert open_model_source(tiny_path).config == config  # parsed again, entry rewritten
    _forget()
    assert isinstance(open_gguf_index(tiny_path), GGUFIndex)


def test_empty_cache_dir_turns_the_index_off(
    monkeypatch: pytest.MonkeyPatch, tiny_path: str
) -> None:
    monkeypatch.setenv("KVSERVE_CACHE_DIR", "")
    _forget()
    try:
        assert isinstance(open_gguf_index(tiny_path), gguf.GGUFReader)
    finally:
        _forget()


def test_long_arrays_keep_only_their_length(cache: Path, bundled_path: str) -> None:
    open_gguf_index(bundled_path)
    _forget()
    index = open_gguf_index(bundled_path)
    tokens = index.fields["tokenizer.ggml.tokens"]
    assert len(tokens.data) == 49152 > gguf_index.MAX_ARRAY
    with pytest.raises(KeyError, match="only its length"):
        tokens.contents()


def test_an_entry_that_does_not_fit_the_file_is_parsed_again(cache: Path, tiny_path: str) -> None:
    config = open_model_source(tiny_path).config
    entry = _entry(cache)
    payload = json.loads(entry.read_text())
    payload["tensors"][0][3] = 10**12  # an offset past the end of the file
    entry.write_text(json.dumps(payload))
    _forget()
    assert open_model_source(tiny_path).config == config
