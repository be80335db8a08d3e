"""The disk cache of GGUF-converted tokenizers: a cached load behaves exactly like the fresh
conversion, a damaged entry is converted again, an empty KVSERVE_CACHE_DIR turns it off."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kvserve.loader import gguf_tokenizer_cache
from kvserve.loader.tokenizer import Tokenizer, _convert_gguf, _load_gguf

TEXTS = [
    "Hello world!  \n\n  tabs\there",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>after",
    "émoji 🤖 中文 ",
    "   leading spaces and trailing   ",
]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kvserve-cache")


@pytest.fixture(scope="module")
def converted_and_cached(bundled_path: str, cache_dir: Path) -> tuple[Tokenizer, Tokenizer, Path]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVSERVE_CACHE_DIR", str(cache_dir))
        entry = gguf_tokenizer_cache.entry_dir(bundled_path)
        assert entry is not None and not entry.exists()
        converted = Tokenizer(*_convert_gguf(bundled_path), bundled_path)
        gguf_tokenizer_cache.write_entry(entry, converted.hf, converted.chat_template,
                                         list(converted.eos_token_ids))  # fmt: skip
        cached = _load_gguf(bundled_path)
    return converted, cached, entry


def test_cached_tokenizer_behaves_like_the_conversion(converted_and_cached) -> None:  # noqa: ANN001
    converted, cached, entry = converted_and_cached
    assert (entry / "tokenizer.json").is_file()
    for text in TEXTS:
        ids = converted.encode(text)
        assert cached.encode(text) == ids
        assert cached.encode(text, add_special_tokens=True) == converted.encode(text, True)
        assert cached.decode(ids) == converted.decode(ids)
        assert cached.decode(ids, skip_special_tokens=False) == text
    assert cached.hf.get_vocab() == converted.hf.get_vocab()
    assert cached.hf.all_special_ids == converted.hf.all_special_ids
    assert (cached.eos_token_ids, cached.bos_token_id, cached.vocab_size) == (
        converted.eos_token_ids, converted.bos_token_id, converted.vocab_size)  # fmt: skip
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert cached.chat_template == converted.chat_template is not None
    assert cached.apply_chat_template(messages) == converted.apply_chat_template(messages)


def test_a_damaged_entry_is_a_miss_and_is_removed(converted_and_cached, tmp_path: Path) -> None:  # noqa: ANN001
    _, _, entry = converted_and_cached
    damaged = tmp_path / "entry"
    shutil.copytree(entry, damaged)
    (damaged / "tokenizer.json").write_text("{not json")
    assert gguf_tokenizer_cache.read_entry(damaged) is None
    assert not damaged.exists()  # the next conversion can store it again


def test_an_empty_cache_dir_turns_the_cache_off(
    bundled_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVSERVE_CACHE_DIR", "")
    assert gguf_tokenizer_cache.entry_dir(bundled_path) is None
    assert gguf_tokenizer_cache.read_entry(None) is None


def test_an_unwritable_cache_costs_only_the_next_start(
    converted_and_cached,
    tmp_path: Path,  # noqa: ANN001
) -> None:
    converted, _, _ = converted_and_cached
    blocker = tmp_path / "file"
    blocker.write_text("")
    entry = blocker / "gguf-tokenizers" / "x"  # its parent cannot be made: a file is in the way
    gguf_tokenizer_cache.write_entry(entry, converted.hf, None, [0])
    assert not entry.exists()
