"""ROUGE-L F1 on hand-checked cases: English as rouge-score computes it, Chinese by character."""

from __future__ import annotations

import pytest
from rouge_score import rouge_scorer

from kvserve.evaluate.rouge import UnicodeTokenizer, rouge_l


def test_english_hand_checked() -> None:
    # LCS("the cat sat on the mat", "the cat lay on the mat") = the cat on the mat = 5 of 6
    assert rouge_l("The cat sat on the mat.", "the cat lay on the mat") == pytest.approx(5 / 6)
    # reference 3 tokens, prediction 4, LCS 2 ("a", "c"): P = 2/4, R = 2/3, F = 4/7
    assert rouge_l("a b c", "a x c y") == pytest.approx(4 / 7)
    assert rouge_l("same text", "Same, text!") == 1.0
    assert rouge_l("completely different", "nothing shared") == 0.0


@pytest.mark.parametrize(
    "text",
    [
        "The cat sat on the mat.",
        "Order #4821: 3 items, $45.10 total (shipped 2024-03-12)!",
        "snake_case and CamelCase, x-y",
    ],
)
def test_same_tokens_as_rouge_score_on_ascii(text: str) -> None:
    from rouge_score import tokenize

    assert UnicodeTokenizer().tokenize(text) == tokenize.tokenize(text, None)


def test_english_scores_match_the_library() -> None:
    lib = rouge_scorer.RougeScorer(["rougeL"])
    for ref, pred in [("the quick brown fox", "a quick brown dog jumps"), ("x y z", "z y x")]:
        assert rouge_l(ref, pred) == pytest.approx(lib.score(ref, pred)["rougeL"].fmeasure)


def test_chinese_by_character() -> None:
    # the library drops every Han character: two different Chinese replies tie at 0 with equal
    assert (
        rouge_scorer.RougeScorer(["rougeL"]).score("我喜欢猫", "我喜欢猫")["rougeL"].fmeasure == 0
    )
    assert rouge_l("我喜欢猫", "我喜欢猫") == 1.0
    # 我 喜 欢 猫 vs 我 喜 欢 狗: LCS 3 of 4 each side
    assert rouge_l("我喜欢猫。", "我喜欢狗。") == pytest.approx(0.75)
    # 今 天 天 气 很 好 (6) vs 今 天 很 好 (4): LCS 4, P = 1, R = 4/6, F = 0.8
    assert rouge_l("今天天气很好", "今天很好") == pytest.approx(0.8)


def test_mixed_scripts_and_edges() -> None:
    tokens = UnicodeTokenizer().tokenize("用 Python 写代码，café 3.5")
    assert tokens == ["用", "python", "写", "代", "码", "café", "3", "5"]
    assert UnicodeTokenizer().tokenize("こんにちは世界") == list("こんにちは世界")
    assert rouge_l("", "") == 1.0  # two empty replies are the same reply
    assert rouge_l("...", "!") == 1.0
    assert rouge_l("", "something") == 0.0
