#!/usr/bin/env python3
"""The 8-bit KV cache (--kv-cache-dtype int8 | fp8) against f16, for BENCHMARKS.md:

  decode      tokens/s of 32 decode steps after a context of d tokens (`inferd bench latency -p 0
              -n 32 -d D`, llama-bench's -d), f16 / int8 / fp8 KV, and llama-bench on the same
              file with its f16 and q8_0 KV cache (flash attention on, which its q8_0 V needs),
              interleaved per depth: SmolLM2-135M Q4_1 at 1k / 4k / 8k (its limit is 8192) and the
              Qwen2.5-0.5B-shaped Q8_0 model of scripts/peer/make_models.py at 1k / 4k / 16k
  capacity    one `inferd serve` per dtype with the same --kv-cache-memory, 16 concurrent requests
              of ~450 prompt tokens and 64 generated: the most requests running at once (sampled
              from /metrics), preemptions, and the wall time of the whole load
  perplexity  `inferd perplexity` on tests/fixtures/text/evaluation.txt and calibration.txt per dtype

    scripts/bench/kv_dtype_bench.py [decode] [capacity] [perplexity] [--reps 2] [--depths-smollm 1024,4096,8000]
        [--depths-qwen 1024,4096,16384]
"""
import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import INFERD, PEER_DIR, ROOT, peer_build  # noqa: E402

MODELS = os.path.join(PEER_DIR, "models")
DTYPES = ("f16", "int8", "fp8")


def ours(model, depth, dtype, args):
    p = subprocess.run([INFERD, "bench", "latency", "-m", model, "-t", "2", "-p", "0", "-n", str(args.tokens),
                        "-d", str(depth), "-r", str(args.reps), "--kv-cache-dtype", dtype, "--json"],
                       check=True, capture_output=True, text=True)
    return json.loads(p.stdout.strip().splitlines()[-1])["generation_tokens_per_second"]


def peer(model, depth, ctk, args):
    p = subprocess.run([os.path.join(PEER_DIR, "bin", "llama-bench"), "-m", model, "-t", "2", "-p", "0", "-n",
                        str(args.tokens), "-d", str(depth), "-r", str(args.reps), "-fa", "1", "-ctk", ctk, "-ctv", ctk,
                        "-o", "json"], check=True, capture_output=True, text=True)
    return json.loads(p.stdout)[0]["avg_ts"]


def decode(args):
    print(f"peer: {peer_build()}")
    print(f"\ntg{args.tokens} at depth d, tokens/s (2 threads, {args.reps} repetitions each)\n")
    print("| model | depth | inferd f16 | inferd int8 | inferd fp8 | int8 / f16 | fp8 / f16 | llama.cpp f16 | "
          "llama.cpp q8_0 | inferd int8 / llama.cpp q8_0 | inferd f16 / llama.cpp f16 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    runs = [("SmolLM2-135M Q4_1", os.path.join(MODELS, "smollm2-135m-q4_1.gguf"), args.depths_smollm),
            ("Qwen2.5-0.5B shapes Q8_0", os.path.join(MODELS, "qwen2.5-0.5b-shapes-q8_0.gguf"), args.depths_qwen)]
    for name, model, depths in runs:
        if not os.path.exists(model):
            sys.exit(f"{model} is missing: run scripts/peer/make_models.py --types q8_0")
        for d in depths:
            r = {dt: ours(model, d, dt, args) for dt in DTYPES}
            # inferd's figures first: a run that times out in the peer's still leaves them.
            print(f"  (inferd at {d}: " + ", ".join(f"{dt} {v:.1f}" for dt, v in r.items()) + ")", flush=True)
            pf16, pq8 = peer(model, d, "f16", args), peer(model, d, "q8_0", args)
            print(f"| {name} | {d} | {r['f16']:.1f} | {r['int8']:.1f} | {r['fp8']:.1f} | {r['int8'] / r['f16']:.2f}x | "
                  f"{r['fp8'] / r['f16']:.2f}x | {pf16:.1f} | {pq8:.1f} | {r['int8'] / pq8:.2f}x | "
                  f"{r['f16'] / pf16:.2f}x |", flush=True)


def metric(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def start_logged(*flags):
    """start_server, also returning the KV cache's token count from the start-up log."""
    p = subprocess.Popen([INFERD, "serve", "--port", "0", "-t", "2", *flags], stderr=subprocess.PIPE, text=True)
    port = tokens = None
    for line in p.stderr:
        m = re.search(r"listening on http://[\d.]+:(\d+)", line)
        port = port or (int(m.group(1)) if m else None)
        m = re.search(r"KV cache: \d+ blocks of \d+ tokens = (\d+) tokens max", line)
        tokens = tokens or (int(m.group(1)) if m else None)
        if "ready:" in line:
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
            return p, port, tokens
    raise SystemExit("inferd serve exited before it was ready")


def capacity(args):
    text = open(os.path.join(ROOT, "tests", "fixtures", "text", "evaluation.txt")).read()
    prompts = [f"Request {i}. Summarise this text in one paragraph.\n\n" + text[i * 200:i * 200 + 1800]
               for i in range(args.sequences)]
    print(f"\n{args.sequences} concurrent requests (~450 prompt tokens, {args.gen} generated, greedy), "
          f"--kv-cache-memory {args.memory}, SmolLM2-135M Q4_1\n")
    print("| KV dtype | KV tokens | most running at once | preemptions | wall s | output tok/s |")
    print("|---|---|---|---|---|---|")
    for dtype in DTYPES:
        proc, port, kv_tokens = start_logged("--kv-cache-memory", args.memory, "--kv-cache-dtype", dtype,
                                             "--max-num-seqs", str(args.sequences), "--no-prefix-caching")
        try:
            def one(p):
                body = {"messages": [{"role": "user", "content": p}], "max_tokens": args.gen, "temperature": 0,
                        "ignore_eos": True}
                req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                             data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=900) as r:
                    return json.loads(r.read())["usage"]["completion_tokens"]
            peak = [0.0]
            done = threading.Event()

            def sample():
                while not done.is_set():
                    peak[0] = max(peak[0], metric(port, "inferd:num_requests_running"))
                    time.sleep(0.1)
            t = threading.Thread(target=sample, daemon=True)
            t.start()
            t0 = time.time()
            with concurrent.futures.ThreadPoolExecutor(args.sequences) as pool:
                tokens = sum(pool.map(one, prompts))
            wall = time.time() - t0
            done.set()
            t.join()
            pre = metric(port, "inferd:num_preemptions_total")
            print(f"| {dtype} | {kv_tokens} | {peak[0]:.0f} | {pre:.0f} | {wall:.1f} | "
                  f"{tokens / wall:.1f} |", flush=True)
        finally:
            proc.terminate()
            proc.wait()


def perplexity(args):
    print("\nperplexity of SmolLM2-135M Q4_1 per KV dtype (chunks of 512, second halves scored)\n")
    print("| text | " + " | ".join(DTYPES) + " | int8 / f16 | fp8 / f16 |")
    print("|---|" + "---|" * (len(DTYPES) + 2))
    for name in ("evaluation.txt", "calibration.txt"):
        path = os.path.join(ROOT, "tests", "fixtures", "text", name)
        ppl = {}
        for dtype in DTYPES:
            p = subprocess.run([INFERD, "perplexity", "-t", "2", "-f", path, "--kv-cache-dtype", dtype, "--json"],
                               check=True, capture_output=True, text=True)
            ppl[dtype] = json.loads(p.stdout.strip().splitlines()[-1])["perplexity"]
        print(f"| {name} | " + " | ".join(f"{ppl[d]:.3f}" for d in DTYPES) +
              f" | {ppl['int8'] / ppl['f16']:.4f} | {ppl['fp8'] / ppl['f16']:.4f} |", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("parts", nargs="*", default=["decode", "capacity", "perplexity"])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--depths-smollm", type=lambda s: [int(x) for x in s.split(",") if x], default=[1024, 4096, 8000])
    ap.add_argument("--depths-qwen", type=lambda s: [int(x) for x in s.split(",") if x], default=[1024, 4096, 16384])
    ap.add_argument("--sequences", type=int, default=16)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--memory", default="40MiB")
    args = ap.parse_args()
    print(f"CPU: {open('/proc/cpuinfo').read().split('model name')[1].split(':')[1].splitlines()[0].strip()}")
    for part in args.parts:
        {"decode": decode, "capacity": capacity, "perplexity": perplexity}[part](args)


if __name__ == "__main__":
    main()
