"""Tool-call and reasoning parsers on fixed model outputs, whole and fed in pieces."""

from __future__ import annotations

import json

import pytest

from kvserve.server.chat_output import ChatOutputSplitter
from kvserve.server.reasoning_parsers import ThinkReasoningParser
from kvserve.server.text_tags import partial_tag_len
from kvserve.server.tool_parsers import HermesToolParser


def _feed_in_pieces(splitter: ChatOutputSplitter, text: str, size: int) -> tuple[str, str, list]:
    reasoning = content = ""
    for i in range(0, len(text), size):
        r, c = splitter.feed(text[i : i + size])
        reasoning, content = reasoning + r, content + c
    r, c, calls = splitter.finish()
    return reasoning + r, content + c, calls


CASES = [
    # (model output, reasoning, content, tool names)
    ("Paris is the capital.", "", "Paris is the capital.", []),
    ("<think>The user asks X.</think>\n\nThe answer.", "The user asks X.", "The answer.", []),
    ("<think>unfinished thought", "unfinished thought", "", []),
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>', "", "",
     ["get_weather"]),
    ('Let me check.\n<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
     '<tool_call>{"name": "b", "arguments": {"x": 1}}</tool_call>', "", "Let me check.\n",
     ["a", "b"]),
    ('<think>need a tool</think><tool_call>[{"name": "a", "arguments": {"q": "é"}}]</tool_call>',
     "need a tool", "", ["a"]),
    ("<tool_call>{not json}</tool_call>", "", "<tool_call>{not json}</tool_call>", []),
    ("a < b <tool and <think> later", "", "a < b <tool and <think> later", []),
]  # fmt: skip


@pytest.mark.parametrize("text,reasoning,content,names", CASES)
@pytest.mark.parametrize("size", [1, 3, 10_000])
def test_split_whole_and_streamed_agree(
    text: str, reasoning: str, content: str, names: list[str], size: int
) -> None:
    got_r, got_c, calls = _feed_in_pieces(ChatOutputSplitter("think", "hermes", ""), text, size)
    assert (got_r, got_c) == (reasoning, content)
    assert [c["function"]["name"] for c in calls] == names
    for call in calls:
        assert call["id"].startswith("call_") and call["type"] == "function"
        json.loads(call["function"]["arguments"])


def test_tool_arguments_are_json_strings() -> None:
    p = HermesToolParser()
    p.feed('<tool_call>{"name": "f", "arguments": {"city": "Zürich", "n": 2}}</tool_call>')
    _, calls = p.finish()
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Zürich", "n": 2}


def test_think_opened_by_the_prompt() -> None:
    p = ThinkReasoningParser(prompt_text="<|im_start|>assistant\n<think>\n")
    r, c = p.feed("step one</think>Answer")
    assert (r, c) == ("step one", "Answer")


def test_no_parsers_pass_text_through() -> None:
    splitter = ChatOutputSplitter(None, None, "")
    assert splitter.split_all("<think>x</think><tool_call>{}</tool_call>") == (
        "",
        "<think>x</think><tool_call>{}</tool_call>",
        [],
    )


def test_partial_tag_len() -> None:
    assert partial_tag_len("abc<too", "<tool_call>") == 4
    assert partial_tag_len("abc", "<tool_call>") == 0
    assert partial_tag_len("<tool_call", "<tool_call>") == 10
