"""Scorers on hand-checked replies, English and Chinese."""

from __future__ import annotations

import pytest

from kvserve.evaluate.scorers import SCORERS, first_json_object, read_choice, read_number, score


@pytest.mark.parametrize(
    ("output", "answer", "want"),
    [
        ("Paris", "Paris", 1.0),
        ("  **Paris.**\nIt is the capital.", "Paris", 1.0),  # first line, emphasis, full stop
        ("Answer: paris", "Paris", 1.0),
        ("The city is Paris.", "Paris", 0.0),  # exact means exact
        ("重庆。", "重庆", 1.0),
        ("答案：重庆", "重庆", 1.0),
        ("「重庆」", "重庆", 1.0),
        ("重庆市", "重庆", 0.0),
        ("42", 42, 1.0),
    ],
)
def test_exact(output: str, answer: object, want: float) -> None:
    assert score("exact", output, answer) == want


@pytest.mark.parametrize(
    ("output", "want"),
    [
        ("13", 13.0),
        ("He has 13 apples left.", 13.0),
        ("20 - 7 = 13", 13.0),  # the working comes first: the last number
        ("The answer is 13, from 20 - 7.", 13.0),  # an "answer" marker wins
        ("1,234 dollars", 1234.0),
        ("１３个", 13.0),  # full-width digits
        ("答案是 13。因为 18 减 5", 13.0),
        ("−4 degrees", -4.0),
        ("2.50", 2.5),
        ("no idea", None),
    ],
)
def test_read_number(output: str, want: float | None) -> None:
    assert read_number(output) == want


def test_number_scorer() -> None:
    assert score("number", "13", 13) == 1.0
    assert score("number", "13.0 apples", "13") == 1.0
    assert score("number", "14", 13) == 0.0
    assert score("number", "I cannot say", 13) == 0.0


@pytest.mark.parametrize(
    ("output", "want"),
    [
        ("B", "B"),
        ("B. pilot", "B"),
        ("(C)", "C"),
        ("The answer is D.", "D"),
        ("Answer: (a)", "A"),
        ("答案是C", "C"),
        ("选B。", "B"),
        ("A bakery opens at 7.", None),  # the article "A" is not a choice
        ("I think option C fits.", "C"),
        ("pilot", None),
    ],
)
def test_read_choice(output: str, want: str | None) -> None:
    assert read_choice(output) == want


def test_choice_and_contains() -> None:
    assert score("choice", "B) pilot", "B") == 1.0
    assert score("choice", "B) pilot", "A") == 0.0
    assert score("contains", "The order ships to  Oslo today", "oslo today") == 1.0
    assert score("contains", "小明住在北京。", ["小明", "北京"]) == 1.0
    assert score("contains", "小明住在北京。", ["小明", "上海"]) == 0.0


def test_json_fields() -> None:
    answer = {"name": "Maria", "quantity": 6, "order_id": 3511}
    fenced = '```json\n{"name": "maria", "quantity": "6", "order_id": 3511}\n```'
    assert score("json_fields", fenced, answer) == 1.0
    assert score("json_fields", 'Sure! {"name": "Maria", "quantity": 7}', answer) == 1 / 3
    assert score("json_fields", "no json here {oops", answer) == 0.0
    zh = '{"name": "张伟", "product": "耳机", "quantity": 2}'
    assert score("json_fields", zh, {"name": "张伟", "product": "耳机", "quantity": 2}) == 1.0
    assert first_json_object('x {bad} y {"a": 1}') == {"a": 1}


def test_regex() -> None:
    assert score("regex", "the sea is calm.", r"\A(?=[\s\S]*[a-z])[^A-Z]+\Z") == 1.0
    assert score("regex", "The sea is calm.", r"\A(?=[\s\S]*[a-z])[^A-Z]+\Z") == 0.0
    assert score("regex", "Trains are fast. DONE\n", r"DONE\W*\Z") == 1.0
    assert score("regex", "好的，秋天很美。", r"\A\W*好的") == 1.0
    assert score("regex", "秋天很美。", r"\A\W*好的") == 0.0


@pytest.mark.parametrize(
    ("scorer", "answer"),
    [
        ("number", "twelve"),
        ("number", True),
        ("choice", "AB"),
        ("choice", "Z"),
        ("json_fields", ["a"]),
        ("json_fields", {}),
        ("regex", "(unclosed"),
        ("exact", ""),
        ("contains", []),
    ],
)
def test_check_rejects_unusable_answers(scorer: str, answer: object) -> None:
    with pytest.raises(ValueError, match=scorer):
        SCORERS[scorer].check(answer)
