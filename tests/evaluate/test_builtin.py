"""Built-in task sets: deterministic from the seed, both languages, and every checkable answer
is one its scorer accepts (the answer written as a reply scores 1)."""

from __future__ import annotations

import json

import pytest

from kvserve.errors import ConfigError
from kvserve.evaluate.builtin import GENERATORS, builtin_tasks
from kvserve.evaluate.scorers import score


def test_deterministic_and_sized() -> None:
    a, b = builtin_tasks(4, seed=7), builtin_tasks(4, seed=7)
    assert [(t.id, t.messages, t.answer) for t in a] == [(t.id, t.messages, t.answer) for t in b]
    assert [t.messages for t in builtin_tasks(4, seed=8)] != [t.messages for t in a]
    assert len(a) == 4 * len(GENERATORS) == 28
    assert {t.lang for t in a} == {"en", "zh"}
    assert all(t.endpoint == "chat" for t in a)
    assert {t.type: t.scorer for t in a} == {
        "arithmetic": "number", "table_lookup": "exact", "extraction": "json_fields",
        "reading_choice": "choice", "instruction": "regex", "summary": None, "rewrite": None,
    }  # fmt: skip


def _reply(task) -> str:  # noqa: ANN001
    if task.scorer == "json_fields":
        return json.dumps(task.answer, ensure_ascii=False)
    return str(task.answer)


@pytest.mark.parametrize("seed", [0, 1])
def test_answers_are_accepted_by_their_scorer(seed: int) -> None:
    for task in builtin_tasks(6, seed=seed):
        if task.scorer in (None, "regex"):
            continue
        assert score(task.scorer, _reply(task), task.answer) == 1.0, task.id
        if task.scorer == "exact":  # the value is read out of the table in the prompt
            assert f"| {task.answer} |" in task.user_text(), task.id


def test_choice_answer_is_the_right_option() -> None:
    for task in builtin_tasks(6, types=("reading_choice",)):
        text = task.user_text()
        option = next(line[3:] for line in text.splitlines() if line.startswith(f"{task.answer}. "))
        assert option in text.split("\n\n")[1], task.id  # the option's fact is in the passage


def test_regex_constraints_accept_a_compliant_reply() -> None:
    replies = {
        r"\A(?=[\s\S]*[a-z])[^A-Z]+\Z": "the sea is calm.",
        r"DONE\W*\Z": "Rain is nice. DONE",
        r"\A\W*Yes\b": "Yes, trains are fast.",
        r"\A\W*好的": "好的，秋天很美。",
        r"完毕\W*\Z": "秋天很美，完毕。",
        r"\A[\s\S]{1,20}\Z": "火车很快。",
    }
    for task in builtin_tasks(12, types=("instruction",)):
        reply = replies.get(task.answer)
        if reply is None:  # "repeat this sentence": the sentence itself
            reply = task.user_text().split("：")[-1].split(": ")[-1]
        assert score("regex", reply, task.answer) == 1.0, (task.id, task.answer, reply)


def test_unknown_type_or_language() -> None:
    with pytest.raises(ConfigError, match="fr"):
        builtin_tasks(2, langs=("fr",))
    with pytest.raises(ConfigError, match="poetry"):
        builtin_tasks(2, types=("poetry",))
