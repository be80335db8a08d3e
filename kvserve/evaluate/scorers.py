"""Task scorers: ``score(output, answer) -> float`` in [0, 1], and ``check(answer)`` that
rejects an answer a scorer cannot use (so a bad task row is reported at load time, not scored 0).

- exact: the reply's answer part (``normalize.value``) equals the answer's.
- number: the number after the last "answer"/"答案" marker, else the last number in the reply
  (as GSM8K-style graders read it: the working comes first), equals the answer (relative
  tolerance 1e-6; thousands separators and full-width digits read).
- choice: the option letter the reply picks (A-J) equals the answer letter.
- contains: the answer (or every item of a list of answers) appears in the reply.
- json_fields: share of the answer's fields that the first JSON object in the reply matches.
- regex: the pattern matches somewhere in the stripped reply (``re.search``; anchor with ``\\A``
  and ``\\Z``, add flags inline, e.g. ``(?i)``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvserve.evaluate.normalize import loose, nfkc, value

_NUMBER = r"[-−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_NUMBER_RE = re.compile(_NUMBER)
_MARKED_NUMBER_RE = re.compile(
    r"(?:answer|答案|result|结果)\D{0,12}?(" + _NUMBER + ")", re.IGNORECASE
)
_LETTERS = "ABCDEFGHIJ"
_CHOICE_PATTERNS = [
    # "Answer: B", "the answer is (C)", "答案是B", "选B"
    re.compile(
        r"(?:answer|答案|选项|选)\s*(?:is|是|为|:)?\s*[:：]?\s*[(（]?([A-J])(?![A-Za-z])",
        re.IGNORECASE,
    ),
    # a reply that starts with the letter: "B", "B.", "(B)", "B) ...", "B: ..." (not "A bakery")
    re.compile(r"^\W*[(（]?([A-J])(?:[).:：、,，）]|\s*$)"),
    # "(C)" or "option C" anywhere
    re.compile(r"[(（]([A-J])[)）]|option\s+([A-J])\b", re.IGNORECASE),
]


def _to_float(text: str) -> float | None:
    try:
        return float(nfkc(text).replace(",", "").replace("−", "-").strip())
    except ValueError:
        return None


def read_number(output: str) -> float | None:
    text = nfkc(output)
    marked = _MARKED_NUMBER_RE.findall(text)
    if marked:
        return _to_float(marked[-1])
    found = _NUMBER_RE.findall(text)
    return _to_float(found[-1]) if found else None


def read_choice(output: str) -> str | None:
    text = nfkc(output).strip()
    for pattern in _CHOICE_PATTERNS:
        found = pattern.search(text)
        if found:
            return next(g for g in found.groups() if g).upper()
    return None


def first_json_object(output: str) -> dict | None:
    """The first ``{...}`` in the reply that parses as a JSON object (code fences allowed)."""
    decoder = json.JSONDecoder()
    start = output.find("{")
    while start != -1:
        try:
            obj, _ = decoder.raw_decode(output, start)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            return obj
        start = output.find("{", start + 1)
    return None


def _same_value(got: Any, want: Any) -> bool:
    a, b = _to_float(str(got)), _to_float(str(want))
    if a is not None and b is not None and not isinstance(got, bool | dict | list):
        return math.isclose(a, b, rel_tol=1e-6)
    if isinstance(want, dict | list):
        return json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)
    return value(str(got)) == value(str(want))


def _exact(output: str, answer: Any) -> float:
    return float(value(output) == value(str(answer)))


def _number(output: str, answer: Any) -> float:
    got = read_number(output)
    return float(got is not None and math.isclose(got, float(answer), rel_tol=1e-6, abs_tol=1e-9))


def _choice(output: str, answer: Any) -> float:
    return float(read_choice(output) == str(answer).strip().upper())


def _contains(output: str, answer: Any) -> float:
    wanted = answer if isinstance(answer, list) else [answer]
    text = loose(output)
    return float(all(loose(str(w)) in text for w in wanted))


def _json_fields(output: str, answer: Any) -> float:
    got = first_json_object(output) or {}
    hits = sum(1 for k, v in answer.items() if k in got and _same_value(got[k], v))
    return hits / len(answer)


def _regex(output: str, answer: Any) -> float:
    return float(re.search(answer, output.strip()) is not None)


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _check_number(answer: Any) -> None:
    _need(
        not isinstance(answer, bool) and _to_float(str(answer)) is not None,
        f"scorer 'number' needs a numeric answer, got {answer!r}",
    )


def _check_choice(answer: Any) -> None:
    _need(
        isinstance(answer, str) and len(answer.strip()) == 1 and answer.strip().upper() in _LETTERS,
        f"scorer 'choice' needs an option letter A-J, got {answer!r}",
    )


def _check_contains(answer: Any) -> None:
    items = answer if isinstance(answer, list) else [answer]
    _need(
        bool(items) and all(isinstance(i, str | int | float) and str(i) for i in items),
        "scorer 'contains' needs a non-empty string or a list of them",
    )


def _check_json_fields(answer: Any) -> None:
    _need(
        isinstance(answer, dict) and bool(answer),
        "scorer 'json_fields' needs a non-empty JSON object of expected fields",
    )


def _check_regex(answer: Any) -> None:
    _need(isinstance(answer, str), "scorer 'regex' needs the pattern as a string")
    try:
        re.compile(answer)
    except re.error as exc:
        raise ValueError(f"scorer 'regex': bad pattern {answer!r}: {exc}") from None


def _check_exact(answer: Any) -> None:
    _need(
        isinstance(answer, str | int | float)
        and not isinstance(answer, bool)
        and bool(str(answer).strip()),
        "scorer 'exact' needs a non-empty string or number",
    )


@dataclass(frozen=True)
class Scorer:
    name: str
    score: Callable[[str, Any], float]
    check: Callable[[Any], None]


SCORERS: dict[str, Scorer] = {
    s.name: s
    for s in (
        Scorer("exact", _exact, _check_exact),
        Scorer("number", _number, _check_number),
        Scorer("choice", _choice, _check_choice),
        Scorer("contains", _contains, _check_contains),
        Scorer("json_fields", _json_fields, _check_json_fields),
        Scorer("regex", _regex, _check_regex),
    )
}


def score(scorer: str, output: str, answer: Any) -> float:
    return SCORERS[scorer].score(output, answer)
