"""Property-based fuzz of every endpoint in the server's OpenAPI schema (fixed seed and
budget): no 5xx, no dropped connection, OpenAI's error shape on every 4xx; afterwards the
server is healthy, the admission ledger and the KV pages are back to zero and greedy output
is unchanged."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.server.conftest import Server, assert_invariants
from tests.server.schema_fuzz import (
    Endpoint,
    SchemaStrategies,
    check_response,
    encode,
    endpoints,
)

# examples per endpoint with a body; the whole module takes about two minutes on 2 cores
BUDGET = {"/v1/completions": 220, "/v1/chat/completions": 220, "/tokenize": 80,
          "/detokenize": 60}  # fmt: skip
GREEDY = {"prompt": "The three primary colours are", "max_tokens": 12, "temperature": 0}


@pytest.fixture(scope="module")
def schema(server: Server) -> dict:
    return httpx.get(server.url + "/openapi.json", timeout=30).json()


@pytest.fixture(scope="module")
def greedy_before(server: Server) -> str:
    resp = httpx.post(server.url + "/v1/completions", json=GREEDY, timeout=120)
    return resp.json()["choices"][0]["text"]


def _send(http: httpx.Client, method: str, path: str, body: object | None) -> None:
    headers = {"content-type": "application/json"}
    content = encode(body) if body is not None else None
    stream = isinstance(body, dict) and body.get("stream") is True
    with http.stream(method, path, content=content, headers=headers) as resp:
        if resp.status_code == 200 and stream:
            events = [line for line in resp.iter_lines() if line.startswith("data: ")]
            assert events and events[-1] == "data: [DONE]", events[-3:]
            check_response(resp, events)
        else:
            resp.read()
            check_response(resp)


def test_every_endpoint_is_listed(schema: dict) -> None:
    paths = {e.path for e in endpoints(schema)}
    assert {"/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize",
            "/health", "/v1/models", "/metrics", "/version"} <= paths  # fmt: skip
    assert set(BUDGET) == {e.path for e in endpoints(schema) if e.body_schema}


def _fuzz_one(http: httpx.Client, strategies: SchemaStrategies, ep: Endpoint) -> None:
    assert ep.body_schema is not None

    @settings(max_examples=BUDGET[ep.path], derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(body=strategies.body(ep.body_schema) | st.none())
    def fuzz(body: object) -> None:
        _send(http, ep.method, ep.path, body)

    fuzz()


def test_fuzz_endpoints(server: Server, schema: dict, greedy_before: str) -> None:
    strategies = SchemaStrategies(schema)
    with httpx.Client(base_url=server.url, timeout=120) as http:
        for ep in endpoints(schema):
            if ep.body_schema is None:
                for method in (ep.method, "HEAD", "DELETE"):
                    _send(http, method, ep.path, None)
            else:
                _fuzz_one(http, strategies, ep)
    assert_invariants(server.url)
    after = httpx.post(server.url + "/v1/completions", json=GREEDY, timeout=120)
    assert after.json()["choices"][0]["text"] == greedy_before
