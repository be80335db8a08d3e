"""Chat template rendering: the model's own Jinja template in a sandbox, as transformers does it.

The environment mirrors ``transformers.utils.chat_template_utils`` (trim/lstrip blocks, loop
controls, a ``tojson`` that does not HTML-escape, ``raise_exception``, ``strftime_now``) so a
template renders here exactly as it does under ``tokenizer.apply_chat_template``.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=16)
def compile_chat_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def render_chat_template(
    source: str,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
    documents: list[dict[str, Any]] | None = None,
    special_tokens: dict[str, str] | None = None,
    **kwargs: Any,
) -> str:
    """Render ``messages`` with ``source``; ``special_tokens`` (bos_token, ...) become variables.

    Keys whose value is None are dropped from each message, as transformers does, because
    templates handle a missing key but often print a literal "None".
    """
    clean = [{k: v for k, v in message.items() if v is not None} for message in messages]
    context = {**(special_tokens or {}), **kwargs}
    return compile_chat_template(source).render(
        messages=clean,
        tools=tools,
        documents=documents,
        add_generation_prompt=add_generation_prompt,
        **context,
    )
