"""Text a request may carry: any Unicode but lone surrogates (``"\\ud800"`` in JSON), which no
tokenizer, template or UTF-8 encoder accepts. NUL and other control characters are accepted.
The check walks nested values iteratively, so deep JSON cannot exhaust the stack here."""

from __future__ import annotations

from typing import Any


def has_lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def check_text(text: str) -> str:
    """A pydantic after-validator: a ValueError becomes a 400 naming the field."""
    if has_lone_surrogate(text):
        raise ValueError("the text contains a lone UTF-16 surrogate (not valid Unicode)")
    return text


def check_json_value(value: Any) -> Any:
    """The same for every string (keys included) inside a free-form JSON value."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            check_text(item)
        elif isinstance(item, dict):
            for key, sub in item.items():
                if isinstance(key, str):
                    check_text(key)
                stack.append(sub)
        elif isinstance(item, list):
            stack.extend(item)
    return value
