#!/usr/bin/env python3
"""KV offload tiers (issue 6), through `inferd serve` and a real redis-server.

    python3 scripts/bench/offload_bench.py hit [--prefix-tokens 2000] [--repeats 3]
    python3 scripts/bench/offload_bench.py workload [--questions 16] [--rate 0.5] [--prefixes 2]
    python3 scripts/bench/offload_bench.py stall [--prefix-tokens 2000] [--repeats 3]

hit: TTFT of one request whose ~2,000-token prompt is (a) recomputed, (b) loaded from the disk
tier, (c) loaded from the Redis tier. For (b) and (c) one server process computes the prompt and
offloads it (watermark 0); then a fresh process, whose pool is empty, gets the same request: its
prefix comes only from the tier. Each figure is the median over --repeats fresh processes.

workload: --prefixes system prompts of ~1,500 tokens taking turns, --questions questions, Poisson
arrivals; TTFT p50 / p99 and output tokens/s with prefix caching off, on (the pool holds every
prefix), and a pool forced small (holds about one prefix) without a tier, with the disk tier, and
with the Redis tier.

stall: whether a tier load holds up the running requests (issue 17: KV arrives asynchronously). A
streamed request decodes (short prompt, 1,000 tokens) while a second request arrives whose
~2,000-token prefix only a tier holds (offloaded by an earlier process). Reports the loaded
request's TTFT and the decoding stream's inter-token gaps: its median over the run, and its
largest gap while the other request's prefix was loading (from its arrival to its first token).
"""
import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prefix_bench import PARAGRAPH, count_tokens, one, post, run  # noqa: E402
from serve_util import free_port, start_server  # noqa: E402


class Redis:
    def __init__(self):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--loglevel", "warning"], stdout=subprocess.DEVNULL)
        time.sleep(0.5)

    def flush(self):
        subprocess.run(["redis-cli", "-p", str(self.port), "FLUSHALL"], stdout=subprocess.DEVNULL, check=True)

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def metric(port, name):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    buf = b""
    while True:
        c = s.recv(65536)
        if not c:
            break
        buf += c
    s.close()
    total = 0.0
    for line in buf.decode().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def system_prompt(port, tokens, salt=""):
    text = salt
    while count_tokens(port, [{"role": "system", "content": text}]) < tokens:
        text += PARAGRAPH
    return text


def ttft_of(port, messages):
    out = []
    one(port, messages, out)
    return out[0][0]


def wait_offloaded(port, min_blocks):
    deadline = time.time() + 120
    while metric(port, "inferd:kv_offload_writes_total") < min_blocks:
        if time.time() > deadline:
            raise RuntimeError("offload did not finish")
        time.sleep(0.1)


def offload_prefix(flags, messages, n):
    """A first process computes `messages` (an n-token prefix) and offloads it to the tier in `flags`."""
    p, port = start_server(*flags, "--kv-offload-watermark", "0")
    ttft_of(port, messages)
    wait_offloaded(port, (n - 20) // 16)
    p.terminate()
    p.wait()


def hit(args):
    p, port = start_server()
    system = system_prompt(port, args.prefix_tokens)
    n = count_tokens(port, [{"role": "system", "content": system}])
    p.terminate()
    p.wait()
    print(f"system prompt {n} tokens + a question, 16 output tokens; median of {args.repeats} fresh processes")
    redis = Redis()
    disk = tempfile.mkdtemp(prefix="inferd_offload_")
    rows = []
    try:
        for label, flags in [("recompute (prefix caching on, nothing cached)", None),
                             ("disk tier hit", ["--kv-offload-dir", disk]),
                             ("Redis tier hit", ["--kv-offload-redis", redis.url])]:
            ttfts = []
            for r in range(args.repeats):
                messages = [{"role": "system", "content": system},
                            {"role": "user", "content": f"Question {r}: summarise the guide."}]
                if flags is not None:  # a first process computes and offloads the prefix
                    shutil.rmtree(disk, ignore_errors=True)
                    redis.flush()
                    offload_prefix(flags, messages, n)
                p, port = start_server(*(flags or []), "--kv-offload-watermark", "0") if flags else start_server()
                ttfts.append(ttft_of(port, messages))
                if flags:
                    loaded = metric(port, "inferd:kv_offload_reads_total")
                    assert loaded >= (n - 40) // 16, f"{label}: only {loaded} blocks loaded"
                p.terminate()
                p.wait()
            rows.append((label, statistics.median(ttfts), ttfts))
    finally:
        redis.stop()
        shutil.rmtree(disk, ignore_errors=True)
    base = rows[0][1]
    print("| TTFT of the request | median (s) | runs (s) | vs recompute |")
    print("|---|---|---|---|")
    for label, med, runs in rows:
        print(f"| {label} | {med:.3f} | {', '.join(f'{t:.3f}' for t in runs)} | {med / base:.3f}x |")


def stream_times(port, messages, max_tokens, out):
    """Streams a chat request; appends (send time, [arrival time of each content chunk])."""
    t0 = time.perf_counter()
    s = post(port, "/v1/chat/completions", {"messages": messages, "max_tokens": max_tokens, "ignore_eos": True,
                                            "stream": True})
    buf, times = b"", []
    while b"data: [DONE]" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            break
        now = time.perf_counter()
        buf += chunk
        while b"\n\n" in buf and not buf.startswith(b"data: [DONE]"):
            event, buf = buf.split(b"\n\n", 1)
            line = event.split(b"data: ", 1)[-1]
            if line.startswith(b"{"):
                delta = json.loads(line)["choices"][0]["delta"] if json.loads(line).get("choices") else {}
                if delta.get("content"):
                    times.append(now)
            if buf.startswith(b"data: [DONE]"):
                break
    s.close()
    out.append((t0, times))


def stall(args):
    if args.inferd:
        import serve_util
        serve_util.INFERD = os.path.abspath(args.inferd)
    p, port = start_server()
    system = system_prompt(port, args.prefix_tokens)
    n = count_tokens(port, [{"role": "system", "content": system}])
    p.terminate()
    p.wait()
    print(f"a 1000-token stream decoding while a request with a {n}-token tier-held prefix arrives; "
          f"{args.repeats} fresh processes per tier")
    redis = Redis()
    disk = tempfile.mkdtemp(prefix="inferd_offload_")
    print("| tier | loaded request TTFT (s) | stream median gap (ms) | stream largest gap during the load (ms) |")
    print("|---|---|---|---|")
    try:
        for label, flags in [("disk", ["--kv-offload-dir", disk]), ("Redis", ["--kv-offload-redis", redis.url])]:
            for r in range(args.repeats):
                messages = [{"role": "system", "content": system},
                            {"role": "user", "content": f"Question {r}: summarise the guide."}]
                shutil.rmtree(disk, ignore_errors=True)
                redis.flush()
                offload_prefix(flags, messages, n)
                p, port = start_server(*flags, "--kv-offload-watermark", "0")
                streamed = []
                t = threading.Thread(target=stream_times,
                                     args=(port, [{"role": "user", "content": "Tell me a story."}], 1000, streamed))
                t.start()
                time.sleep(0.5)
                loaded = []
                t_sent = time.perf_counter()
                one(port, messages, loaded)
                t.join()
                ttft = loaded[0][0]
                reads = metric(port, "inferd:kv_offload_reads_total")
                p.terminate()
                p.wait()
                assert reads >= (n - 40) // 16, f"{label}: only {reads} blocks loaded"
                times = streamed[0][1]
                gaps = [b - a for a, b in zip(times, times[1:])]
                window = [b - a for a, b in zip(times, times[1:]) if b >= t_sent and a <= t_sent + ttft]
                assert window, "the stream ended before the loaded request arrived"
                print(f"| {label} | {ttft:.3f} | {1000 * statistics.median(gaps):.1f} | "
                      f"{1000 * max(window or [0]):.1f} |")
    finally:
        redis.stop()
        shutil.rmtree(disk, ignore_errors=True)


def run_workload(flags, workload, rate, seed):
    def counters(port):
        return metric(port, "inferd:prefix_cache_hits_total"), metric(port, "inferd:kv_offload_reads_total")
    p50, p99, tps, (hits, loaded) = run(flags, workload, rate, seed, start_fn=start_server, after=counters)
    return p50, p99, tps, hits, loaded


def workload(args):
    p, port = start_server()
    systems = [system_prompt(port, 1500, salt=f"Guide {k}. ") for k in range(args.prefixes)]
    n_sys = count_tokens(port, [{"role": "system", "content": systems[0]}])
    p.terminate()
    p.wait()
    work = [[{"role": "system", "content": systems[i % args.prefixes]},
             {"role": "user", "content": f"Question {i}: what does section {i * 7 % 13} of the guide say?"}]
            for i in range(args.questions)]
    # A small pool holds one system prompt and a little room: 48 MiB = 136 blocks of 16 here.
    small = ["--kv-cache-memory", args.small_pool]
    big = ["--kv-cache-memory", "512MiB"]
    redis = Redis()
    disk = tempfile.mkdtemp(prefix="inferd_offload_")
    print(f"{args.prefixes} system prompts of ~{n_sys} tokens taking turns, {args.questions} questions, "
          f"Poisson {args.rate}/s, 16 output tokens; small pool = {args.small_pool}")
    print("| mode | TTFT p50 (s) | TTFT p99 (s) | output tokens/s | prefix hit tokens | blocks from tier |")
    print("|---|---|---|---|---|---|")
    modes = [("caching off", big + ["--no-prefix-caching"]), ("caching on", big), ("small pool, no tier", small),
             ("small pool + disk tier", small + ["--kv-offload-dir", disk]),
             ("small pool + Redis tier", small + ["--kv-offload-redis", redis.url])]
    try:
        for label, flags in modes:
            if args.only and args.only not in label:
                continue
            r = run_workload(flags, work, args.rate, 1)
            print(f"| {label} | {r[0]:.2f} | {r[1]:.2f} | {r[2]:.1f} | {int(r[3])} | {int(r[4])} |", flush=True)
    finally:
        redis.stop()
        shutil.rmtree(disk, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("hit")
    h.add_argument("--prefix-tokens", type=int, default=2000)
    h.add_argument("--repeats", type=int, default=3)
    w = sub.add_parser("workload")
    w.add_argument("--questions", type=int, default=16)
    w.add_argument("--rate", type=float, default=0.5)
    w.add_argument("--prefixes", type=int, default=2)
    w.add_argument("--small-pool", default="48MiB")
    w.add_argument("--only", default="", help="run only the modes whose label contains this")
    st = sub.add_parser("stall")
    st.add_argument("--prefix-tokens", type=int, default=2000)
    st.add_argument("--repeats", type=int, default=2)
    st.add_argument("--inferd", default=None, help="the inferd binary (default: build/inferd)")
    args = ap.parse_args()
    {"hit": hit, "workload": workload, "stall": stall}[args.cmd](args)


if __name__ == "__main__":
    main()
