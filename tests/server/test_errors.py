"""Bad input gets an OpenAI-shaped 4xx, never a 500; a client that hangs up frees its pages."""

from __future__ import annotations

import socket
import time

import httpx
import openai
import pytest

from tests.server.conftest import Server, metrics, wait_idle


def _error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def test_malformed_json_and_fields(server: Server) -> None:
    url = server.url + "/v1/chat/completions"
    headers = {"content-type": "application/json"}
    _error(httpx.post(url, content=b'{"messages": [', headers=headers), 400)
    _error(httpx.post(url, content=b"\xff\xfe", headers=headers), 400)
    err = _error(httpx.post(url, json={"messages": "hi"}), 400)
    assert err["param"] == "messages"
    _error(httpx.post(url, json={"messages": []}), 400)
    _error(httpx.post(url, json={"messages": [{"role": "wizard", "content": "x"}]}), 400)
    err = _error(httpx.post(server.url + "/v1/completions", json={"prompt": "x", "n": "two"}), 400)
    assert err["param"] == "n"


@pytest.mark.parametrize(
    "body,param",
    [
        ({"prompt": "hi", "temperature": -1}, "temperature"),
        ({"prompt": "hi", "top_p": 0}, "top_p"),
        ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "hi", "logprobs": 50}, "logprobs"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [1, 99999999]}, "prompt"),
        ({"prompt": "hi", "echo": True, "logprobs": 1}, "echo"),
    ],
)
def test_bad_values_name_their_param(server: Server, body: dict, param: str) -> None:
    err = _error(httpx.post(server.url + "/v1/completions", json=body), 400)
    assert err["param"] == param


def test_context_length_error_says_both_numbers(server: Server) -> None:
    ctx = httpx.get(server.url + "/v1/models").json()["data"][0]["max_model_len"]
    body = {"prompt": "one two three", "max_tokens": ctx}
    err = _error(httpx.post(server.url + "/v1/completions", json=body), 400)
    assert str(ctx) in err["message"] and "prompt (" in err["message"]
    assert err["param"] == "max_tokens"


def test_unknown_model_route_and_method(server: Server) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="hi", max_tokens=1)
    _error(httpx.get(server.url + "/v1/nothing"), 404)
    _error(httpx.get(server.url + "/v1/completions"), 405)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=[], max_tokens=1)


def _send(server: Server, path: str, body: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port))
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
    sock.sendall(head + body)
    return sock


def test_disconnect_mid_stream_frees_pages(server: Server) -> None:
    before = metrics(server.url)
    body = (b'{"prompt": "Tell me a long story.", "max_tokens": 2000, "ignore_eos": true, '
            b'"stream": true}')  # fmt: skip
    sock = _send(server, "/v1/completions", body)
    got = b""
    while got.count(b"data: ") < 5:  # a few tokens streamed
        chunk = sock.recv(4096)
        assert chunk, "server closed the connection"
        got += chunk
    sock.close()
    m = wait_idle(server.url)
    assert m["kvserve:request_success_total"] == before["kvserve:request_success_total"] + 1
    generated = m["kvserve:generation_tokens_total"] - before["kvserve:generation_tokens_total"]
    assert generated < 2000


def test_disconnect_while_waiting_non_streaming(server: Server) -> None:
    body = b'{"prompt": "Tell me a long story.", "max_tokens": 2000, "ignore_eos": true}'
    sock = _send(server, "/v1/completions", body)
    deadline = time.monotonic() + 60
    while metrics(server.url)["kvserve:num_requests_running"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    sock.close()
    wait_idle(server.url)
