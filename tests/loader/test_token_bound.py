"""The bytes-per-token bound that lets the server refuse a prompt too long for the context
before tokenizing it: it holds on the bundled tokenizer for any text, and it is withheld where a
normalizer or pre-tokenizer can drop or merge characters."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer as RawTokenizer
from tokenizers import models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from kvserve.loader import load_tokenizer
from kvserve.loader.token_bound import max_bytes_per_token, min_tokens


def test_bound_holds_on_the_bundled_tokenizer() -> None:
    tok = load_tokenizer(None)
    longest = tok.max_bytes_per_token
    assert longest is not None and longest > 1
    rng = random.Random(0)
    alphabet = "ab \n\t,.;🤖é中" + "<|im_start|>"
    texts = ["a" * 5000, " " * 4000, "\n" + " " * (longest - 1), "<|im_end|>" * 50, "🤖中文" * 300]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 3000))) for _ in range(20)]
    tight = 0
    for text in texts:
        n = len(tok.encode(text, add_special_tokens=True))
        bound = min_tokens(len(text.encode()), longest)
        assert n >= bound, text[:40]
        tight += n == bound
    assert tight >= 1  # the longest entry is a real run of whitespace: the bound is reached


def _fast(pre: object | None, normalizer: object | None = None) -> PreTrainedTokenizerFast:
    vocab = {"a": 0, "b": 1, "ab": 2, "Ġ": 3}
    raw = RawTokenizer(models.BPE(vocab, [("a", "b")]))
    if pre is not None:
        raw.pre_tokenizer = pre
    if normalizer is not None:
        raw.normalizer = normalizer
    return PreTrainedTokenizerFast(tokenizer_object=raw)


def test_byte_level_tokenizers_get_a_bound() -> None:
    assert max_bytes_per_token(_fast(pre_tokenizers.ByteLevel())) == 2
    llama3_style = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(r"\s+", behavior="isolated"), pre_tokenizers.ByteLevel()]
    )
    assert max_bytes_per_token(_fast(llama3_style)) == 2


@pytest.mark.parametrize(
    ("pre", "normalizer"),
    [
        (pre_tokenizers.ByteLevel(), normalizers.NFKC()),  # "ﬁ" (3 bytes) -> "fi"
        (pre_tokenizers.WhitespaceSplit(), None),  # drops whitespace
        (
            pre_tokenizers.Sequence(
                [pre_tokenizers.Split(" ", behavior="removed"), pre_tokenizers.ByteLevel()]
            ),
            None,
        ),  # fmt: skip
        (None, None),  # not byte-level
    ],
)
def test_no_bound_where_characters_can_vanish(pre: object, normalizer: object) -> None:
    assert max_bytes_per_token(_fast(pre, normalizer)) is None
