"""Hypothesis strategies for request bodies, built from the server's own OpenAPI schema: values
the schema allows, values at and past its bounds, wrong types, hostile text (lone surrogates,
NUL, very long), huge integers, NaN/Infinity and unknown fields. Shared by tests/server/
test_fuzz.py (fixed budget in ``make test``) and benchmarks/hardening_soak.py (the long run).

Generated requests are kept cheap to serve: generation lengths are cut to a few tokens and
lists to a few items, so the budget goes to breadth, not to decoding."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx
from hypothesis import strategies as st

CHEAP_MAX_TOKENS = 4
_HOSTILE_TEXT = ["\ud800", "a\udfffb", "\x00", "nul\x00inside", "", " ", "\u202e", "é" * 3,
                 "<|im_start|>", "{{ 7*7 }}", "\ufffd", "x" * 3000]  # fmt: skip
_HUGE_INTS = [2**63, 2**64 + 1, -(2**63) - 1, 2**100, -(2**100), 2**31, -1, 0]
_HOSTILE = st.sampled_from(
    [None, True, [], {}, "", 1e308, -1e308, float("nan"), float("inf"), [None], {"a": []}]
) | st.sampled_from(_HUGE_INTS) | st.sampled_from(_HOSTILE_TEXT)  # fmt: skip
_UNKNOWN_FIELDS = ["logit_bias", "guided_json", "best_of", "functions", "prompt_logprobs",
                   "response_format", "parallel_tool_calls", "foo", "audio"]  # fmt: skip
_CAPPED = {"max_tokens", "max_completion_tokens"}
_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=12) | st.sampled_from(
    _HOSTILE_TEXT
)


@dataclass
class Endpoint:
    method: str
    path: str
    body_schema: dict[str, Any] | None


def endpoints(schema: dict[str, Any]) -> list[Endpoint]:
    out = []
    for path, methods in sorted(schema["paths"].items()):
        for method, op in sorted(methods.items()):
            content = (op.get("requestBody") or {}).get("content", {})
            body = content.get("application/json", {}).get("schema")
            out.append(Endpoint(method.upper(), path, body))
    return out


class SchemaStrategies:
    def __init__(self, schema: dict[str, Any]) -> None:
        self.components = schema.get("components", {}).get("schemas", {})

    def _resolve(self, node: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in node:
            node = self.components[node["$ref"].rsplit("/", 1)[-1]]
        return node

    def body(self, node: dict[str, Any]) -> st.SearchStrategy[Any]:
        """A top-level body: mostly schema-shaped objects, some hostile or unknown fields."""
        shaped = self.value(node, depth=0)
        extra = st.dictionaries(st.sampled_from(_UNKNOWN_FIELDS), _HOSTILE, max_size=1)
        with_extra = st.tuples(shaped, extra).map(
            lambda t: {**t[0], **t[1]} if isinstance(t[0], dict) else t[0]
        )
        return st.one_of(shaped, shaped, shaped, with_extra, _HOSTILE).map(_cheap)

    def value(self, node: dict[str, Any], depth: int) -> st.SearchStrategy[Any]:
        node = self._resolve(node)
        valid = self._valid(node, depth)
        return st.one_of(valid, valid, valid, valid, _HOSTILE) if depth else valid

    def _valid(self, node: dict[str, Any], depth: int) -> st.SearchStrategy[Any]:
        if "const" in node:
            return st.just(node["const"])
        if "enum" in node:
            return st.sampled_from(node["enum"])
        for key in ("anyOf", "oneOf"):
            if key in node:
                return st.one_of([self.value(sub, depth + 1) for sub in node[key]])
        kind = node.get("type")
        if kind == "object" or "properties" in node:
            return self._object(node, depth)
        if kind == "array":
            items = self.value(node.get("items", {}), depth + 1)
            return st.lists(items, min_size=node.get("minItems", 0), max_size=3)
        if kind == "string":
            return _TEXT
        if kind == "integer":
            return _integers(node)
        if kind == "number":
            return st.floats(-3, 3) | st.sampled_from([0.0, 1.0, 2.5, 1e-9])
        if kind == "boolean":
            return st.booleans()
        if kind == "null":
            return st.none()
        return st.none() | st.integers(-3, 3) | _TEXT  # free-form value

    def _object(self, node: dict[str, Any], depth: int) -> st.SearchStrategy[dict[str, Any]]:
        props = node.get("properties", {})
        if not props:
            return st.dictionaries(_TEXT, st.integers(-3, 3) | _TEXT, max_size=2)
        required = set(node.get("required", []))
        fields = {k: self.value(v, depth + 1) for k, v in props.items()}
        return st.fixed_dictionaries(
            {k: v for k, v in fields.items() if k in required},
            optional={k: v for k, v in fields.items() if k not in required},
        )


def _integers(node: dict[str, Any]) -> st.SearchStrategy[int]:
    lo, hi = node.get("minimum"), node.get("maximum")
    edges = [v for b in (lo, hi) if b is not None for v in (b - 1, b, b + 1)]
    return st.integers(-2, 20) | st.sampled_from(edges or [0]) | st.sampled_from(_HUGE_INTS)


def _cheap(body: Any) -> Any:
    """Cut a valid generation length to a few tokens (out-of-range values stay as they are)."""
    if not isinstance(body, dict):
        return body
    for key in _CAPPED & set(body):
        value = body[key]
        if value is None or (type(value) is int and CHEAP_MAX_TOKENS < value < 2**31):
            body[key] = CHEAP_MAX_TOKENS  # None: the server's default, which is long
    if not _CAPPED & set(body) and ("messages" in body or "prompt" in body):
        body["max_tokens"] = CHEAP_MAX_TOKENS
    return body


def encode(body: Any) -> bytes:
    """JSON as a hostile client writes it: NaN/Infinity literals, surrogates escaped."""
    return json.dumps(body, allow_nan=True).encode()


def check_response(resp: httpx.Response, streamed_events: list[str] | None = None) -> None:
    """No 5xx; every 4xx in OpenAI's error shape with its status as code; a stream's in-band
    errors likewise below 500."""
    assert resp.status_code < 500, f"{resp.status_code}: {resp.text[:500]}"
    if resp.request.method == "HEAD":  # HTTP: a response to HEAD carries no body
        if resp.status_code == 405:
            assert resp.headers.get("allow"), resp.headers
        return
    if 400 <= resp.status_code < 500:
        err = resp.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}, err
        assert err["code"] == resp.status_code and err["message"], err
    for event in streamed_events or []:
        if event.startswith("data: {") and '"error"' in event[:20]:
            code = json.loads(event[6:])["error"]["code"]
            assert code < 500, event
