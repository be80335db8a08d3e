"""The OpenAI API through a real server, with the real ``openai`` client and raw HTTP."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.server.conftest import Server, metrics

SYSTEM = ("You are a concise assistant for a travel agency. You answer questions about cities, "
          "trains and museums in one or two short sentences, and you never invent prices. "
          "If you do not know something, you say so plainly.")  # fmt: skip


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _chat(question: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def test_chat_streamed_text_equals_non_streamed(client: openai.OpenAI) -> None:
    kw = dict(model="SmolLM2-135M-Instruct", messages=_chat("What is the capital of France?"),
              temperature=0, max_tokens=24)  # fmt: skip
    full = client.chat.completions.create(**kw)
    assert full.object == "chat.completion" and full.choices[0].message.role == "assistant"
    usage = {"include_usage": True}
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options=usage))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content and "Paris" in text
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == full.choices[0].finish_reason
    u = full.usage
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.prompt_tokens_details.cached_tokens >= 0


def test_completions_prompt_forms_and_streaming(client: openai.OpenAI, server: Server) -> None:
    ids = httpx.post(server.url + "/tokenize", json={"prompt": "The capital of France is"}).json()
    by_text = client.completions.create(model="SmolLM2-135M-Instruct",
                                        prompt="The capital of France is", max_tokens=8,
                                        temperature=0)  # fmt: skip
    by_ids = client.completions.create(model="SmolLM2-135M-Instruct", prompt=ids["tokens"],
                                       max_tokens=8, temperature=0)  # fmt: skip
    assert by_text.choices[0].text == by_ids.choices[0].text
    assert by_text.usage.prompt_tokens == ids["count"]
    many = client.completions.create(model="SmolLM2-135M-Instruct",
                                     prompt=["One, two,", "The capital of France is"], max_tokens=8,
                                     temperature=0)  # fmt: skip
    assert [c.index for c in many.choices] == [0, 1]
    assert many.choices[1].text == by_text.choices[0].text
    stream = client.completions.create(model="SmolLM2-135M-Instruct",
                                       prompt="The capital of France is", max_tokens=8,
                                       temperature=0, stream=True)  # fmt: skip
    assert "".join(c.choices[0].text for c in stream) == by_text.choices[0].text


def test_completion_options(client: openai.OpenAI) -> None:
    r = client.completions.create(model="SmolLM2-135M-Instruct", prompt="Count: 1, 2, 3,",
                                  max_tokens=12, temperature=0, echo=True, stop=[" 6"])  # fmt: skip
    text = r.choices[0].text
    assert text.startswith("Count: 1, 2, 3,") and " 6" not in text
    assert r.choices[0].finish_reason == "stop"
    lp = client.completions.create(model="SmolLM2-135M-Instruct", prompt="Count: 1, 2, 3,",
                                   max_tokens=4, temperature=0, logprobs=3)  # fmt: skip
    info = lp.choices[0].logprobs
    assert len(info.tokens) == 4 and all(len(t) == 3 for t in info.top_logprobs)
    assert "".join(info.tokens) == lp.choices[0].text
    n = client.completions.create(model="SmolLM2-135M-Instruct", prompt="A short poem:",
                                  max_tokens=6, n=3, seed=7, temperature=1.0,
                                  extra_body={"ignore_eos": True})  # fmt: skip
    assert len(n.choices) == 3 and n.usage.completion_tokens == 18
    assert len({c.text for c in n.choices}) > 1  # seeds seed, seed+1, seed+2 differ


def test_cached_tokens_and_hit_counter_agree(client: openai.OpenAI, server: Server) -> None:
    before = metrics(server.url)
    usages = [
        client.chat.completions.create(
            model="SmolLM2-135M-Instruct", messages=_chat(q), temperature=0, max_tokens=4
        ).usage  # fmt: skip
        for q in ("Which museum in Madrid?", "Which train to Lyon?")
    ]
    after = metrics(server.url)
    assert usages[1].prompt_tokens_details.cached_tokens > 0
    hits = after["kvserve:prefix_cache_hits_total"] - before["kvserve:prefix_cache_hits_total"]
    queries = (
        after["kvserve:prefix_cache_queries_total"] - before["kvserve:prefix_cache_queries_total"]
    )
    assert hits == sum(u.prompt_tokens_details.cached_tokens for u in usages)
    assert queries == sum(u.prompt_tokens for u in usages)


def test_tool_call_through_server(client: openai.OpenAI) -> None:
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    messages = [
        {"role": "system", "content": "You call tools. To call a tool, answer only with "
         '<tool_call>{"name": ..., "arguments": {...}}</tool_call>. Tools: get_weather(city).'},
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": call},
        {"role": "tool", "content": "sunny"},
        {"role": "user", "content": "What is the weather in London?"},
    ]  # fmt: skip
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]  # fmt: skip
    r = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages,
                                       tools=tools, temperature=0, max_tokens=32)  # fmt: skip
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and len(calls) == 1
    assert calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "London"}
    stream = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages,
                                            tools=tools, temperature=0, max_tokens=32,
                                            stream=True)  # fmt: skip
    deltas = [c.choices[0] for c in stream if c.choices]
    streamed = [tc for d in deltas for tc in (d.delta.tool_calls or [])]
    assert [tc.function.name for tc in streamed] == ["get_weather"]
    assert deltas[-1].finish_reason == "tool_calls"
    plain = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages,
                                           tools=tools, tool_choice="none", temperature=0,
                                           max_tokens=8)  # fmt: skip
    assert not plain.choices[0].message.tool_calls and "<tool" in (
        plain.choices[0].message.content or ""
    )


def test_reasoning_through_server(client: openai.OpenAI) -> None:
    messages = [
        {"role": "system", "content": "Before answering, think inside <think></think> tags."},
        {"role": "user", "content": "Say hello."},
        {"role": "assistant", "content": "<think>The user wants a greeting.</think>Hello!"},
        {"role": "user", "content": "Say thank you."},
        {"role": "assistant", "content": "<think>The user wants thanks.</think>Thank you!"},
        {"role": "user", "content": "Say goodbye."},
    ]
    r = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages,
                                       temperature=0, max_tokens=40)  # fmt: skip
    msg = r.choices[0].message
    reasoning = msg.model_extra.get("reasoning_content")
    assert reasoning and "<think>" not in reasoning and "</think>" not in (msg.content or "")
    stream = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages,
                                            temperature=0, max_tokens=40, stream=True)  # fmt: skip
    parts = [c.choices[0].delta for c in stream if c.choices]
    assert "".join((p.model_extra or {}).get("reasoning_content") or "" for p in parts) == reasoning
    assert "".join(p.content or "" for p in parts) == (msg.content or "")


def test_utility_routes(server: Server) -> None:
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/version").json()["version"]
    models = httpx.get(server.url + "/v1/models").json()
    assert models["data"][0]["id"] == "SmolLM2-135M-Instruct"
    tok = httpx.post(server.url + "/tokenize", json={"prompt": "Hello world"}).json()
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] > 0
    back = httpx.post(server.url + "/detokenize", json={"tokens": tok["tokens"]}).json()
    assert back["prompt"] == "Hello world"
    chat = httpx.post(server.url + "/tokenize",
                      json={"messages": [{"role": "user", "content": "Hi"}]}).json()  # fmt: skip
    assert chat["count"] > tok["count"]


def test_metrics_parse_and_names(server: Server) -> None:
    m = metrics(server.url)
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
                 "prefix_cache_queries_total", "prefix_cache_hits_total", "prompt_tokens_total",
                 "generation_tokens_total", "num_preemptions_total", "request_success_total",
                 "time_to_first_token_seconds_count", "inter_token_latency_seconds_count",
                 "e2e_request_latency_seconds_count",
                 "request_queue_time_seconds_count"):  # fmt: skip
        assert "kvserve:" + name in m, name
    assert m["kvserve:generation_tokens_total"] > 0
    assert m["kvserve:request_success_total"] >= m["kvserve:e2e_request_latency_seconds_count"]
