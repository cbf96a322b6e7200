#!/usr/bin/env python3
"""Server figures for BENCHMARKS.md (issue 5), on the default model.

    python3 scripts/bench/server_bench.py overhead       # HTTP + JSON + SSE cost per request
    python3 scripts/bench/server_bench.py streams 1000   # N concurrent streams held, errors counted

overhead: a 1-token prompt with max_tokens 1, measured (a) in-process: AsyncEngine submit ->
finished callback (build/engine_ttft_bench, Google Benchmark, run before and after); (b) through
the server: a client's time from sending the request to the end of a non-streamed answer, and to
the first SSE chunk of a streamed one; one request at a time, p50 of 60.
streams: N clients open connections at once, each sends a streamed completion (16-token prompt,
max_tokens 4, ignore_eos) and reads to `data: [DONE]`; reports completed / errors / wall time
and the peak of open connections.
"""
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time

from serve_util import ROOT, start_server


def http_once(port, body, stream):
    s = socket.create_connection(("127.0.0.1", port))
    payload = json.dumps(body).encode()
    req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
           + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    t0 = time.perf_counter()
    s.sendall(req)
    buf = b""
    first = None
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
        if stream and first is None and b"data: {" in buf:
            first = time.perf_counter() - t0
        if (stream and b"data: [DONE]" in buf) or (not stream and b"\r\n\r\n" in buf and buf.endswith(b"}")):
            break
    total = time.perf_counter() - t0
    s.close()
    return first if stream else total


def in_process_ms():
    """Median ms of one 1-token request through AsyncEngine (build/engine_ttft_bench)."""
    p = subprocess.run([os.path.join(ROOT, "build", "engine_ttft_bench"), "--benchmark_format=json",
                        "--benchmark_repetitions=5", "--benchmark_report_aggregates_only=true"],
                       capture_output=True, text=True, check=True)
    rows = json.loads(p.stdout)["benchmarks"]
    return next(r["real_time"] for r in rows if r.get("aggregate_name") == "median")


def overhead(reps=60):
    before = in_process_ms()
    p, port = start_server("--kv-cache-memory", "128MiB")
    try:
        body = {"prompt": [504], "max_tokens": 1}
        for _ in range(5):
            http_once(port, body, False)  # warm up
        plain = [http_once(port, body, False) for _ in range(reps)]
        streamed = [http_once(port, dict(body, stream=True), True) for _ in range(reps)]
    finally:
        p.terminate()
        p.wait()
    after = in_process_ms()
    a = (before + after) / 2
    b, c = (statistics.median(x) * 1e3 for x in (plain, streamed))
    print("| path | 1-token request, p50 (ms) | vs in-process (ms) |")
    print("|---|---|---|")
    print(f"| in-process AsyncEngine submit -> finished (median of 5 x >=3 s, before {before:.1f} / after {after:.1f}) | {a:.2f} | — |")
    print(f"| server, non-streamed (request sent -> whole answer) | {b:.2f} | {b - a:+.2f} |")
    print(f"| server, streamed (request sent -> first SSE chunk) | {c:.2f} | {c - a:+.2f} |")


async def one_stream(port, i, state):
    body = json.dumps({"prompt": [100 + (i * 7 + k) % 4000 for k in range(16)], "max_tokens": 4,
                       "ignore_eos": True, "stream": True}).encode()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        state["open"] += 1
        state["peak"] = max(state["peak"], state["open"])
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        await writer.drain()
        buf = b""
        while b"data: [DONE]" not in buf:
            chunk = await reader.read(65536)
            if not chunk:
                break
            buf += chunk
        ok = buf.startswith(b"HTTP/1.1 200") and b"data: [DONE]" in buf and b'"error"' not in buf
        state["done" if ok else "errors"] += 1
        if not ok:
            state["first_error"] = state.get("first_error") or buf[:300]
        writer.close()
        state["open"] -= 1
    except Exception as e:  # noqa: BLE001 - counted
        state["errors"] += 1
        state["first_error"] = state.get("first_error") or repr(e)


async def streams_async(port, n):
    state = {"open": 0, "peak": 0, "done": 0, "errors": 0}
    t0 = time.perf_counter()
    await asyncio.gather(*(one_stream(port, i, state) for i in range(n)))
    return state, time.perf_counter() - t0


def streams(n):
    p, port = start_server("--kv-cache-memory", "512MiB", "--max-queue", str(n * 2), "--max-num-seqs", "64",
                           "--idle-timeout", "600")
    try:
        state, wall = asyncio.run(streams_async(port, n))
    finally:
        p.terminate()
        p.wait()
    print(f"| {n} | {state['peak']} | {state['done']} | {state['errors']} | {wall:.1f} |")
    if state.get("first_error"):
        print("first error:", state["first_error"], file=sys.stderr)


if __name__ == "__main__":
    if sys.argv[1] == "overhead":
        overhead()
    else:
        print("| streams | peak open connections | completed | errors | wall s |")
        print("|---|---|---|---|---|")
        for n in sys.argv[2:] or ["1000"]:
            streams(int(n))
