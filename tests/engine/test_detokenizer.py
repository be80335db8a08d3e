from __future__ import annotations

import pytest

from kvserve.engine.detokenizer import IncrementalDetokenizer
from kvserve.loader import Tokenizer, load_tokenizer

TEXTS = [
    "Hello, world! This is a plain ASCII sentence.",
    "  leading spaces,\ttabs and\nnew\n\nlines  ",
    "中文测试：你好，世界！今天天气很好。",
    "日本語のテキストと한국어 텍스트",
    "emoji 😀🚀🎉 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 and skin tones 👍🏽",
    "accents: café, naïve, Ångström, façade, jalapeño, Žluťoučký kůň",
    "math ∀x∈ℝ: x² ≥ 0 → √(x²) = |x|; ∑ ∫ ≈ ≠",
    "mixed: def f(x): return '你好' + x  # 😀 é",
    "Ελληνικά και русский текст, עברית, العربية",
    "<|im_start|>assistant\nspecial tokens around text<|im_end|>",
]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return load_tokenizer(None)


def stream(tok: Tokenizer, ids: list[int], prompt: list[int], skip: bool = True) -> list[str]:
    detok = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
    chunks = [detok.add(token) for token in ids]
    chunks.append(detok.flush())
    assert detok.text == "".join(chunks)
    assert detok.output_token_ids == ids
    return chunks


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("skip", [True, False])
def test_stream_equals_full_decode(tok: Tokenizer, text: str, skip: bool) -> None:
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Say it."}]))
    ids = tok.encode(text)
    chunks = stream(tok, ids, prompt, skip)
    assert "".join(chunks) == tok.decode(ids, skip_special_tokens=skip)
    if not skip:
        assert "".join(chunks) == text
    assert not any("\ufffd" in chunk for chunk in chunks)
    assert chunks[-1] == ""  # nothing was left held back


def test_multibyte_characters_split_across_tokens_are_held_back(tok: Tokenizer) -> None:
    ids = tok.encode("😀")
    assert len(ids) > 1  # the emoji's bytes really are split over tokens ...
    assert tok.decode(ids[:1]).endswith("\ufffd")  # ... so its first token alone is incomplete
    detok = IncrementalDetokenizer(tok, tok.encode("Smile: "))
    chunks = [detok.add(token) for token in ids]
    assert chunks[:-1] == [""] * (len(ids) - 1)
    assert chunks[-1] == "😀"


def test_every_split_text_is_exercised(tok: Tokenizer) -> None:
    split = [t for t in TEXTS if any(tok.decode([i]).endswith("\ufffd") for i in tok.encode(t))]
    assert len(split) >= 5


def test_incomplete_character_at_end_is_flushed(tok: Tokenizer) -> None:
    ids = tok.encode("ok 你")[:-1]  # cut inside the last character
    assert tok.decode(ids).endswith("\ufffd")
    detok = IncrementalDetokenizer(tok, [])
    emitted = "".join(detok.add(token) for token in ids)
    assert "\ufffd" not in emitted
    assert emitted + detok.flush() == tok.decode(ids)


def test_long_generation_with_many_texts(tok: Tokenizer) -> None:
    ids = tok.encode(" ".join(TEXTS * 3))
    chunks = stream(tok, ids, [])
    assert "".join(chunks) == tok.decode(ids)
    assert sum(1 for chunk in chunks if chunk) > len(ids) // 2


def test_first_token_keeps_its_leading_space(tok: Tokenizer) -> None:
    prompt = tok.encode("The answer is")
    ids = tok.encode(" forty two")
    assert "".join(stream(tok, ids, prompt)) == " forty two"
