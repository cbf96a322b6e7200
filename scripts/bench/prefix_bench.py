#!/usr/bin/env python3
"""Prefix caching on a shared-system-prompt chat workload (issue 6), through `inferd serve`.

    python3 scripts/bench/prefix_bench.py [--questions 16] [--rate 0.5] [--system-tokens 1500]

One system prompt of about --system-tokens tokens (English text), --questions different user
questions, Poisson arrivals at --rate requests/s (fixed seed), streamed chat completions of 16
tokens (ignore_eos). TTFT = request sent -> first content chunk. Runs the server with prefix
caching off, then on, same workload.
"""
import argparse
import json
import random
import socket
import statistics
import threading
import time

from serve_util import start_server

PARAGRAPH = ("The operators of a large service keep a written guide for every team. It says how requests "
             "arrive, how they are queued, which limits apply to each customer, and what to do when a "
             "machine fails in the middle of the night. New engineers read it in their first week. ")


def start(*flags):
    return start_server("--kv-cache-memory", "512MiB", *flags)


def post(port, path, body):
    s = socket.create_connection(("127.0.0.1", port))
    data = json.dumps(body).encode()
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


def count_tokens(port, messages):
    s = post(port, "/tokenize", {"messages": messages})
    buf = b""
    while not buf.endswith(b"}"):
        buf += s.recv(65536)
    s.close()
    return json.loads(buf.split(b"\r\n\r\n", 1)[1])["count"]


def one(port, messages, out):
    t0 = time.perf_counter()
    s = post(port, "/v1/chat/completions", {"messages": messages, "max_tokens": 16, "ignore_eos": True, "stream": True})
    buf, ttft = b"", None
    while b"data: [DONE]" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
        if ttft is None and b'"content":"' in buf.replace(b'"content":""', b""):
            ttft = time.perf_counter() - t0
    out.append((ttft, time.perf_counter() - t0))
    s.close()


def run(flags, workload, rate, seed, start_fn=None, after=None):
    """Sends the workload at Poisson arrivals to a fresh server started by start_fn(*flags);
    returns TTFT p50, TTFT p99, output tokens/s, and after(port) (read before the server stops)."""
    p, port = (start_fn or start)(*flags)
    try:
        rng = random.Random(seed)
        results, threads = [], []
        t0 = time.perf_counter()
        for messages in workload:
            th = threading.Thread(target=one, args=(port, messages, results))
            th.start()
            threads.append(th)
            time.sleep(rng.expovariate(rate))
        for th in threads:
            th.join()
        wall = time.perf_counter() - t0
        extra = after(port) if after else None
    finally:
        p.terminate()
        p.wait()
    ttfts = sorted(r[0] for r in results)
    p99 = ttfts[min(len(ttfts) - 1, int(round(0.99 * (len(ttfts) - 1))))]
    return statistics.median(ttfts), p99, len(results) * 16 / wall, extra


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", type=int, default=16)
    ap.add_argument("--rate", type=float, default=0.5)
    ap.add_argument("--system-tokens", type=int, default=1500)
    args = ap.parse_args()
    p, port = start()
    system = ""
    while count_tokens(port, [{"role": "system", "content": system}]) < args.system_tokens:
        system += PARAGRAPH
    n_sys = count_tokens(port, [{"role": "system", "content": system}])
    p.terminate()
    p.wait()
    workload = [[{"role": "system", "content": system},
                 {"role": "user", "content": f"Question {i}: what does section {i * 7 % 13} of the guide say?"}]
                for i in range(args.questions)]
    print(f"system prompt {n_sys} tokens, {args.questions} questions, Poisson {args.rate}/s, 16 output tokens")
    print("| prefix caching | TTFT p50 (s) | TTFT p99 (s) | output tokens/s |")
    print("|---|---|---|---|")
    off = run(["--no-prefix-caching"], workload, args.rate, 1)
    print(f"| off | {off[0]:.2f} | {off[1]:.2f} | {off[2]:.1f} |")
    on = run([], workload, args.rate, 1)
    print(f"| on | {on[0]:.2f} | {on[1]:.2f} | {on[2]:.1f} |")
    print(f"TTFT p50 on / off = {on[0] / off[0]:.3f}")


if __name__ == "__main__":
    main()
