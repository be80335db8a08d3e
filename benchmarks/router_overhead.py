"""What `kvserve route` adds, measured against `kvserve bench`'s load sink (a fake OpenAI server
that answers at once), directly and through the router.

- latency: the added P50 TTFT and E2E latency at --concurrency (100) streams, measured like the
  low part below but with the sink pacing its tokens at --token-delay (10 ms, a fast model's
  decode), so 100 streams load the router lightly, as real traffic does. (`kvserve bench`'s
  httpx client is not used here: at 100 streams its own event loop adds ~20 ms to every TTFT and
  the difference of two such medians is noise, even negative.)
- throughput: a lean raw-socket HTTP/1.1 load generator (the bench client, httpx, tops out at
  a few hundred requests/s a core) keeps C streams in flight for some seconds; streamed
  requests/s directly and through the router. The router runs pinned to its own core when the
  machine has more than one; the generator and the sink share the others.
- low: the added latency at low concurrency (--low-concurrency, default 1, 4 and 16 streams),
  measured by the raw-socket client (far cheaper than the bench client, so it is the router's
  share that shows, even on 2 busy cores): rounds alternate direct and routed, the sink paces its
  chunks (--low-token-delay); median TTFT (request written to first body chunk) and E2E per side,
  and the router's CPU time per routed request. The 1-minute load average is kept per figure.
Writes benchmarks/results/router_overhead_<date>.json.

    .venv/bin/python -m benchmarks.router_overhead
    .venv/bin/python -m benchmarks.router_overhead --parts low --tag cpu   # a busy 2-core box
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

from benchmarks.common import write_result
from kvserve.bench.load_sink import running_sink
from kvserve.router.launch import start_router

_HEALTH = ("--health-check-endpoint", "/v1/models")  # the sink has no /health


def _request(port: int, output_len: int) -> bytes:
    body = json.dumps({"model": "load-sink", "prompt": "hello " * 16, "max_tokens": output_len,
                       "stream": True}).encode()  # fmt: skip
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")  # fmt: skip
    return head.encode() + body


async def _read_answer(reader: asyncio.StreamReader) -> float:
    """One streamed 200 answer (chunked body to its last chunk); returns when its first body
    chunk arrived (perf_counter)."""
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"bad answer: {head[:80]!r}")
    first = 0.0
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        await reader.readexactly(size + 2)
        first = first or time.perf_counter()
        if size == 0:
            return first


async def _stream_loop(port: int, payload: bytes, stop_at: float, done: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    while time.perf_counter() < stop_at:
        writer.write(payload)
        await _read_answer(reader)
        done[0] += 1
    writer.close()


async def _raw_rate(port: int, concurrency: int, seconds: float, output_len: int) -> float:
    payload = _request(port, output_len)
    done = [0]
    warm = time.perf_counter() + 1.0
    await asyncio.gather(*(_stream_loop(port, payload, warm, [0]) for _ in range(concurrency)))
    start = time.perf_counter()
    await asyncio.gather(*(_stream_loop(port, payload, start + seconds, done)
                           for _ in range(concurrency)))  # fmt: skip
    return done[0] / (time.perf_counter() - start)


def raw_rate(url: str, args: argparse.Namespace) -> float:
    import uvloop

    port = int(url.rsplit(":", 1)[1])
    return uvloop.run(_raw_rate(port, args.concurrency, args.seconds, args.output_len))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc), so the router's cost per request
    can be read even when other processes compete for the cores."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def routed_rate(url: str, pid: int, args: argparse.Namespace) -> dict[str, float]:
    """Requests/s through the router, and the router's CPU time per request."""
    port = int(url.rsplit(":", 1)[1])
    import uvloop

    async def measured() -> tuple[float, float, float]:
        payload = _request(port, args.output_len)
        warm = time.perf_counter() + 1.0
        await asyncio.gather(*(_stream_loop(port, payload, warm, [0])
                               for _ in range(args.concurrency)))  # fmt: skip
        done, cpu0, start = [0], cpu_seconds(pid), time.perf_counter()
        await asyncio.gather(*(_stream_loop(port, payload, start + args.seconds, done)
                               for _ in range(args.concurrency)))  # fmt: skip
        return done[0], time.perf_counter() - start, cpu_seconds(pid) - cpu0

    n, wall, cpu = uvloop.run(measured())
    return {"requests_per_s": n / wall, "router_cpu_us_per_request": cpu / n * 1e6,
            "router_cpu_share": cpu / wall,
            "one_core_capacity_requests_per_s": n / cpu if cpu else float("inf")}  # fmt: skip


async def _timed_stream(port: int, payload: bytes, n: int, delay_s: float,
                        out: list[tuple[float, float]]) -> None:  # fmt: skip
    """After ``delay_s``, n requests in a row on one connection: (TTFT, E2E) in seconds each."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await asyncio.sleep(delay_s)
    for _ in range(n):
        start = time.perf_counter()
        writer.write(payload)
        first = await _read_answer(reader)
        out.append((first - start, time.perf_counter() - start))
    writer.close()


def _timed_round(port: int, streams: int, n: int, output_len: int,
                 spread_s: float) -> tuple[float, float]:  # fmt: skip
    """Median TTFT and E2E (ms) of `streams` connections doing n requests each, their starts
    spread evenly over ``spread_s`` (one answer's duration) so that requests arrive staggered,
    as steady traffic does, not as one burst of `streams` requests per round."""
    import uvloop

    out: list[tuple[float, float]] = []
    payload = _request(port, output_len)

    async def run() -> None:
        await asyncio.gather(*(_timed_stream(port, payload, n, i * spread_s / streams, out)
                               for i in range(streams)))  # fmt: skip

    uvloop.run(run())
    return (statistics.median(t for t, _ in out) * 1e3, statistics.median(e for _, e in out) * 1e3)


def added_latency(sink: str, router, stream_counts: list[int], requests: int, token_delay: float,
                  args: argparse.Namespace) -> list[dict]:  # type: ignore[no-untyped-def]  # fmt: skip
    """Added TTFT / E2E at each stream count, rounds alternating direct and routed; ``requests``
    per round, split over the streams; the sink paces its tokens at ``token_delay``."""
    ports = [int(u.rsplit(":", 1)[1]) for u in (sink, router.url)]
    rows = []
    for streams in stream_counts:
        n = max(1, requests // streams)
        spread = args.output_len * token_delay
        sides: dict[str, list[tuple[float, float]]] = {"direct": [], "router": []}
        cpu = 0.0
        _timed_round(ports[1], streams, n, args.output_len, spread)  # warm-up: connections, caches
        for _ in range(args.low_rounds):
            sides["direct"].append(_timed_round(ports[0], streams, n, args.output_len, spread))
            cpu0 = cpu_seconds(router.proc.pid)
            sides["router"].append(_timed_round(ports[1], streams, n, args.output_len, spread))
            cpu += cpu_seconds(router.proc.pid) - cpu0
        med = {side: [statistics.median(r[i] for r in runs) for i in (0, 1)]
               for side, runs in sides.items()}  # fmt: skip
        rows.append({
            "streams": streams, "requests_per_round": n * streams, "rounds": args.low_rounds,
            "direct_p50_ttft_ms": med["direct"][0], "router_p50_ttft_ms": med["router"][0],
            "added_p50_ttft_ms": med["router"][0] - med["direct"][0],
            "direct_p50_e2el_ms": med["direct"][1], "router_p50_e2el_ms": med["router"][1],
            "added_p50_e2el_ms": med["router"][1] - med["direct"][1],
            "router_cpu_us_per_request": cpu / (n * streams * args.low_rounds) * 1e6,
            "load_average_1m": os.getloadavg()[0],
        })  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _router(sink_url: str, cores: list[int] | None):  # type: ignore[no-untyped-def]
    router = start_router("--worker-urls", sink_url, "--policy", "round_robin", *_HEALTH,
                          cpus=cores)  # fmt: skip
    router.wait_ready()
    return router


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--parts", default="latency,throughput", help="of latency,throughput,low")
    p.add_argument("--concurrency", type=int, default=100)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--requests", type=int, default=400, help="latency: requests per round")
    p.add_argument("--token-delay", type=float, default=0.01, help="latency: s/token")
    p.add_argument("--seconds", type=float, default=10.0, help="per throughput run")
    p.add_argument("--low-concurrency", type=lambda v: [int(x) for x in v.split(",")],
                   default=[1, 4, 16], help="low: stream counts")  # fmt: skip
    p.add_argument("--low-requests", type=int, default=160, help="low: requests per round")
    p.add_argument("--low-rounds", type=int, default=5, help="rounds per side (latency, low)")
    p.add_argument("--low-token-delay", type=float, default=0.001, help="low: s/token")
    p.add_argument("--out-dir", default=None, help="default benchmarks/results")
    p.add_argument("--tag", default="", help="appended to the file name (e.g. the machine)")
    return p.parse_args(argv)


def main() -> None:
    args = _parse()
    parts = set(args.parts.split(","))
    cores = sorted(os.sched_getaffinity(0))
    router_cores = [cores[-1]] if len(cores) > 1 else None
    if router_cores:  # this process (the raw generator) and the sink keep off the router's core
        os.sched_setaffinity(0, set(cores[:-1]))
    result: dict = {
        "device": (f"{os.cpu_count()} CPUs; router pinned to core {router_cores}, bench/load "
                   "generator and sink share the rest" if router_cores else
                   "1 CPU shared by the load generator, the router and the sink"),
        "command": "python -m benchmarks.router_overhead " + " ".join(sys.argv[1:]),
        "settings": vars(args), "load_average_1m_at_start": os.getloadavg()[0],
    }  # fmt: skip
    if "latency" in parts:
        with running_sink("--token-delay", str(args.token_delay)) as sink:
            router = _router(sink, router_cores)
            try:
                [row] = added_latency(
                    sink, router, [args.concurrency], args.requests, args.token_delay, args
                )
            finally:
                router.stop()
        result["latency"] = {**row, "token_delay_s": args.token_delay}
    if "throughput" in parts:
        with running_sink() as sink:
            router = _router(sink, router_cores)
            try:
                raw_direct = raw_rate(sink, args)
                raw_routed = routed_rate(router.url, router.proc.pid, args)
            finally:
                router.stop()
        result["throughput"] = {"direct_streamed_requests_per_s": raw_direct, "router": raw_routed}
    if "low" in parts:
        with running_sink("--token-delay", str(args.low_token_delay)) as sink:
            router = _router(sink, router_cores)
            try:
                low = args.low_concurrency, args.low_requests, args.low_token_delay
                result["low_concurrency"] = added_latency(sink, router, *low, args)
            finally:
                router.stop()
    result["load_average_1m_at_end"] = os.getloadavg()[0]
    result["targets"] = {"added_p50_ms_max": 1.0, "router_streamed_requests_per_s_min": 2000}
    name = "router_overhead" + (f"_{args.tag}" if args.tag else "")
    path = write_result(name, result, args.out_dir)
    print(json.dumps(result, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
