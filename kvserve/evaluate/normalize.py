"""Text normalisation shared by the scorers: what counts as "the same answer"."""

from __future__ import annotations

import re
import unicodedata

# "Answer:", "The answer is", "答案：", "答案是" before the value itself.
_ANSWER_PREFIX = re.compile(
    r"^\s*(?:(?:the\s+)?(?:final\s+)?answer\s*(?:is|:)?|答案\s*(?:是|为|:)?)\s*", re.IGNORECASE
)
_WRAPPERS = "\"'`*_“”‘’「」『』《》()（）[]【】 \t"
_TRAILING = ".。!！,，;；:："


def nfkc(text: str) -> str:
    """NFKC folds full-width digits, letters and punctuation (１２３，Ａ) onto ASCII."""
    return unicodedata.normalize("NFKC", text)


def first_line(text: str) -> str:
    for line in text.strip().splitlines():
        if line.strip():
            return line.strip()
    return ""


def value(text: str) -> str:
    """The answer part of a short reply: first non-empty line, NFKC, no "Answer:" prefix, no
    wrapping quotes/markdown emphasis/brackets, no trailing full stop, case-folded, inner
    whitespace collapsed."""
    text = nfkc(first_line(text))
    text = _ANSWER_PREFIX.sub("", text)
    text = text.strip(_WRAPPERS).rstrip(_TRAILING).strip(_WRAPPERS)
    return " ".join(text.casefold().split())


def loose(text: str) -> str:
    """Whole-text normalisation for substring checks: NFKC, case-folded, whitespace collapsed."""
    return " ".join(nfkc(text).casefold().split())
