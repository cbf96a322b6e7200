#!/usr/bin/env python3
"""Decode cost per token at long contexts: full attention against a StreamingLLM window, and
llama.cpp (full attention, flash attention on) on the same file, for BENCHMARKS.md.

tg<n> after a context of d tokens (`inferd bench latency -p 0 -n N -d D`, llama-bench's -d), on
the Qwen2.5-0.5B-shaped Q8_0 model of scripts/peer/make_models.py (32768 positions), f16 KV:

    inferd full        every token attends to all d positions
    inferd streaming   --streaming-llm SINK,WINDOW: the sink and the last WINDOW positions (the
                       depth's prompt is computed through the same window, in chunks of WINDOW,
                       in a KV pool of the window's size, not the depth's)
    llama.cpp          llama-bench -fa 1

    scripts/bench/streaming_decode.py [--depths 1024,8192,32000] [--reps 2] [--window 4,1024]
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import INFERD, PEER_DIR, peer_build  # noqa: E402

MODEL = os.path.join(PEER_DIR, "models", "qwen2.5-0.5b-shapes-q8_0.gguf")


def ours(depth, reps, tokens, window):
    cmd = [INFERD, "bench", "latency", "-m", MODEL, "-t", "2", "-p", "0", "-n", str(tokens), "-d", str(depth),
           "-r", str(reps), "--json"]
    if window:
        cmd += ["--streaming-llm", window]
    p = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(p.stdout.strip().splitlines()[-1])["generation_tokens_per_second"]


def peer(depth, reps, tokens):
    p = subprocess.run([os.path.join(PEER_DIR, "bin", "llama-bench"), "-m", MODEL, "-t", "2", "-p", "0", "-n",
                        str(tokens), "-d", str(depth), "-r", str(reps), "-fa", "1", "-o", "json"],
                       check=True, capture_output=True, text=True)
    return json.loads(p.stdout)[0]["avg_ts"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depths", default="1024,8192,32000")
    ap.add_argument("--reps", type=int, default=2, help="repetitions (1 at depths past 16k)")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--window", default="4,1024", help="SINK,WINDOW")
    args = ap.parse_args()
    if not os.path.exists(MODEL):
        sys.exit(f"{MODEL} is missing: run scripts/peer/make_models.py --types q8_0")
    print(f"peer: {peer_build()}")
    print(f"\ntg{args.tokens} at depth d, tokens/s, Qwen2.5-0.5B shapes Q8_0, f16 KV, 2 threads\n")
    print(f"| depth | inferd full | inferd sink+window {args.window} | llama.cpp (fa) | full / llama.cpp | "
          f"streaming / llama.cpp | streaming / full |")
    print("|---|---|---|---|---|---|---|")
    for d in [int(x) for x in args.depths.split(",")]:
        reps = args.reps if d <= 16384 else 1
        full = ours(d, reps, args.tokens, None)
        win = ours(d, reps, args.tokens, args.window)
        print(f"  (inferd at {d}: full {full:.2f}, streaming {win:.2f})", flush=True)
        ref = peer(d, reps, args.tokens)
        print(f"| {d} | {full:.2f} | {win:.2f} | {ref:.2f} | {full / ref:.2f}x | {win / ref:.2f}x | "
              f"{win / full:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
