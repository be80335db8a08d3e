"""ROUGE-L F1 of a candidate's output against the baseline's, for English and for scripts
written without spaces.

The LCS and the F-measure come from Google's ``rouge-score`` (the package most papers cite).
Where we differ, and why:
- Tokens. Its default tokenizer lower-cases and then keeps only ``[a-z0-9]+`` runs, so every
  Chinese, Japanese or Thai character is dropped (a Chinese reply has no tokens and scores 0
  against anything, itself included) and accented Latin words are cut ("café" -> "caf"). Ours
  gives the same tokens on ASCII text (a test checks this) but keeps Unicode letters and digits,
  and makes each character of a script without spaces (Han, kana, Thai, Lao, Khmer, Myanmar)
  its own unit, the character-level ROUGE used for Chinese summarisation.
- No stemming (the library's default too): we compare two models' outputs, not a reply against
  a human reference, so "runs" and "run" are a real difference.
- Two outputs with no tokens at all (both empty, or only punctuation) are identical: 1.0. The
  library returns 0 when either side is empty; we keep its 0 when only one side is.
"""

from __future__ import annotations

import re

from rouge_score import rouge_scorer

# Scripts written without spaces between words: one token per character.
_CHAR_SCRIPTS = (
    "\u2e80-\u2fdf"  # CJK radicals, Kangxi radicals
    "\u3005\u3007\u3021-\u3029\u3038-\u303b"  # CJK ideographic marks and numerals
    "\u3040-\u30ff\u31f0-\u31ff"  # Hiragana, Katakana
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # CJK ideographs (ext. A, unified, compat.)
    "\U00020000-\U0003134f"  # CJK ideographs, extensions B-G
    "\u0e00-\u0e7f\u0e80-\u0eff"  # Thai, Lao
    "\u1000-\u109f\u1780-\u17ff"  # Myanmar, Khmer
)
_TOKEN_RE = re.compile(rf"[{_CHAR_SCRIPTS}]|(?:(?![{_CHAR_SCRIPTS}])[^\W_])+")


class UnicodeTokenizer:
    """The ``tokenize(text)`` interface ``rouge_scorer.RougeScorer`` accepts."""

    def tokenize(self, text: str) -> list[str]:
        return _TOKEN_RE.findall(text.lower())


_SCORER = rouge_scorer.RougeScorer(["rougeL"], tokenizer=UnicodeTokenizer())


def rouge_l(reference: str, prediction: str) -> float:
    """ROUGE-L F1 in [0, 1] of ``prediction`` against ``reference`` (symmetric)."""
    tok = UnicodeTokenizer()
    if not tok.tokenize(reference) and not tok.tokenize(prediction):
        return 1.0
    return _SCORER.score(reference, prediction)["rougeL"].fmeasure
