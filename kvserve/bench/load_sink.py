"""A minimal OpenAI-shaped streaming endpoint that answers instantly: the load sink used by the
bench tests and by benchmarks/bench_client_capacity.py to measure the client alone.

Raw asyncio HTTP/1.1 with keep-alive and chunked SSE, so the sink costs far less than the client.
It counts prompt tokens with the bench's approximate tokenizer, can act as an ideal prefix cache
(`--prefix-cache`: cached_tokens = the ideal hit of ideal.py) exposed as kvserve: Prometheus
counters, and can inject faults. `--log FILE` records each chunk's send time (perf_counter, which
is the system-wide monotonic clock on Linux) for measuring the client's timing error.

    python -m kvserve.bench.load_sink --port 0      # prints "listening on http://127.0.0.1:N"
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

from kvserve.bench.ideal import PrefixTracker
from kvserve.bench.tokens import ApproxTokenizer

_TAG = re.compile(r"request (\d+):")


class Sink:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tok = ApproxTokenizer()
        self.cache = PrefixTracker() if args.prefix_cache else None
        self.counts = {"prompt_tokens_total": 0, "generation_tokens_total": 0,
                       "prefix_cache_queries_total": 0, "prefix_cache_hits_total": 0,
                       "request_success_total": 0}  # fmt: skip
        self.seen = 0
        self.log = open(args.log, "w") if args.log else None  # noqa: SIM115 (closed at exit)

    def prompt_ids(self, body: dict) -> list[int]:
        if "messages" in body:
            return self.tok.encode(self.tok.render_chat(body["messages"]))
        return self.tok.encode(str(body.get("prompt", "")))

    def metrics(self) -> bytes:
        lines = [f"kvserve:{name} {value}" for name, value in self.counts.items()]
        lines += ["kvserve:num_requests_running 0", "kvserve:num_requests_waiting 0"]
        return ("\n".join(lines) + "\n").encode()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _events(sink: Sink, body: dict, chat: bool) -> Iterator[bytes]:
    ids = sink.prompt_ids(body)
    cached = sink.cache.observe(ids) if sink.cache else 0
    n_out = max(1, int(body.get("max_tokens") or 16))
    sink.counts["prompt_tokens_total"] += len(ids)
    sink.counts["prefix_cache_queries_total"] += len(ids)
    sink.counts["prefix_cache_hits_total"] += cached
    sink.counts["generation_tokens_total"] += n_out
    sink.counts["request_success_total"] += 1
    obj = "chat.completion.chunk" if chat else "text_completion"
    text = "" if sink.args.no_text else " tok"
    for i in range(n_out):
        choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
        choice["finish_reason"] = "length" if i == n_out - 1 else None
        yield json.dumps({"id": "sink", "object": obj, "choices": [choice]}).encode()
    if (body.get("stream_options") or {}).get("include_usage"):
        usage = {"prompt_tokens": len(ids), "completion_tokens": n_out,
                 "total_tokens": len(ids) + n_out,
                 "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip
        yield json.dumps({"id": "sink", "object": obj, "choices": [], "usage": usage}).encode()
    yield b"[DONE]"


async def _stream(sink: Sink, writer: asyncio.StreamWriter, body: dict, chat: bool) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
    sent: list[float] = []
    for n, event in enumerate(_events(sink, body, chat)):
        if sink.args.break_after and n == sink.args.break_after:
            writer.close()  # a server dying mid-stream
            return
        writer.write(_chunk(b"data: " + event + b"\n\n"))
        sent.append(time.perf_counter())
        if sink.args.token_delay:
            await asyncio.sleep(sink.args.token_delay)
        elif n % 64 == 63:
            await writer.drain()
    writer.write(b"0\r\n\r\n")
    if sink.log:
        match = _TAG.search(json.dumps(body.get("prompt") or body.get("messages")))
        sink.log.write(json.dumps({"tag": int(match.group(1)) if match else None, "sent": sent}))
        sink.log.write("\n")


def _reply(writer: asyncio.StreamWriter, status: str, body: bytes, ctype: str) -> None:
    head = f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n"
    writer.write(head.encode() + body)


async def _route(sink: Sink, writer: asyncio.StreamWriter, method: str, path: str,
                 headers: dict[str, str], raw: bytes) -> None:  # fmt: skip
    args = sink.args
    if args.api_key and headers.get("authorization") != f"Bearer {args.api_key}":
        err = {"error": {"message": "invalid API key", "type": "authentication_error"}}
        return _reply(writer, "401 Unauthorized", json.dumps(err).encode(), "application/json")
    if method == "GET" and path == "/v1/models":
        models = {"object": "list", "data": [{"id": "load-sink", "object": "model"}]}
        return _reply(writer, "200 OK", json.dumps(models).encode(), "application/json")
    if method == "GET" and path == "/metrics":
        return _reply(writer, "200 OK", sink.metrics(), "text/plain; version=0.0.4")
    if method != "POST" or path not in ("/v1/completions", "/v1/chat/completions"):
        return _reply(writer, "404 Not Found", b'{"error": {"message": "not found"}}',
                      "application/json")  # fmt: skip
    sink.seen += 1
    if args.fail_every and sink.seen % args.fail_every == 0:
        err = b'{"error": {"message": "injected failure", "type": "server_error"}}'
        return _reply(writer, "500 Internal Server Error", err, "application/json")
    if args.garbage:
        return _reply(writer, "200 OK", b"<html><body>hello</body></html>", "text/html")
    await _stream(sink, writer, json.loads(raw or b"{}"), path.endswith("chat/completions"))


async def _serve_conn(sink: Sink, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:  # fmt: skip
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, OSError):
        while not writer.is_closing():
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, *lines = head.decode("latin-1").split("\r\n")
            method, path, _ = request_line.split(" ", 2)
            headers = {}
            for line in lines:
                key, _, value = line.partition(":")
                headers[key.strip().lower()] = value.strip()
            raw = await reader.readexactly(int(headers.get("content-length", 0) or 0))
            await _route(sink, writer, method, path, headers, raw)
            await writer.drain()
    writer.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m kvserve.bench.load_sink", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--token-delay", type=float, default=0.0, help="seconds between chunks")
    p.add_argument("--prefix-cache", action="store_true", help="report ideal cached_tokens")
    p.add_argument("--fail-every", type=int, default=0, help="every Nth request: HTTP 500")
    p.add_argument("--break-after", type=int, default=0, help="drop the stream after N events")
    p.add_argument("--garbage", action="store_true", help="answer HTML instead of OpenAI JSON")
    p.add_argument("--no-text", action="store_true",
                   help="tokens without text (ids the tokenizer decodes to nothing)")  # fmt: skip
    p.add_argument("--api-key", default=None)
    p.add_argument("--log", default=None, help="JSONL of chunk send times per request")
    return p.parse_args(argv)


async def _main(args: argparse.Namespace) -> None:
    sink = Sink(args)
    server = await asyncio.start_server(lambda r, w: _serve_conn(sink, r, w), args.host,
                                        args.port, backlog=4096)  # fmt: skip
    port = server.sockets[0].getsockname()[1]
    print(f"listening on http://{args.host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()
    if sink.log:
        sink.log.close()


@contextlib.contextmanager
def running_sink(*flags: str) -> Iterator[str]:
    """Starts a sink subprocess on a free port; yields its base URL; stops it."""
    proc = subprocess.Popen([sys.executable, "-m", "kvserve.bench.load_sink", *flags],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.startswith("listening on "):
            raise RuntimeError(f"load sink did not start: {line!r}")
        yield line.split()[-1]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    asyncio.run(_main(parse_args()))
