#!/usr/bin/env python3
"""Scoring a text through the server: completions with echo + logprobs (what evaluation harnesses
send), against the same prompts answered without scores, and the perplexity the scores give against
`inferd perplexity` on the same chunks (the engine's prompt logprobs against the offline tool).

The text is the GPL-3 licence Debian ships in base-files, cut into chunks of CONTEXT tokens; each
chunk is one request with max_tokens 1. Rounds interleave three forms of the same request: plain,
echo + logprobs 1, and vLLM's prompt_logprobs 5. Prefix caching is off, so that no form reuses an
earlier one's KV. Prints a Markdown table (tokens/s of prompt per form and round) and the two
perplexities.

    python3 scripts/bench/prompt_scoring.py [--model M] [--context 1024] [--chunks 4] [--rounds 3]
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import INFERD, start_server  # noqa: E402

TEXT = "/usr/share/common-licenses/GPL-3"


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as r:
        return json.loads(r.read())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    model = ["-m", a.model] if a.model else []
    proc, port = start_server(*model, "--no-prefix-caching", "--max-model-len", str(a.context + 16),
                              "--kv-cache-memory", "256MiB")
    try:
        with open(TEXT) as f:
            ids = post(port, "/tokenize", {"prompt": f.read()})["tokens"]
        chunks = [ids[k * a.context:(k + 1) * a.context] for k in range(a.chunks)]
        forms = {"plain": {}, "echo + logprobs 1": {"echo": True, "logprobs": 1},
                 "prompt_logprobs 5": {"prompt_logprobs": 5}}
        print(f"CPU: {open('/proc/cpuinfo').read().split('model name')[1].split(':')[1].splitlines()[0].strip()}")
        print(f"| round | form | prompt tokens | seconds | prompt tokens/s |")
        print("|---|---|---|---|---|")
        nll, scored = 0.0, 0
        for rnd in range(a.rounds):
            for name, extra in forms.items():
                t0 = time.time()
                for chunk in chunks:
                    r = post(port, "/v1/completions", {"prompt": chunk, "max_tokens": 1, "temperature": 0, **extra})
                    if rnd == 0 and name.startswith("echo"):  # the second half of each chunk, as the tool scores
                        lps = r["choices"][0]["logprobs"]["token_logprobs"]
                        for j in range(a.context // 2 + 1, a.context):
                            nll -= lps[j]
                            scored += 1
                dt = time.time() - t0
                n = a.context * len(chunks)
                print(f"| {rnd + 1} | {name} | {n} | {dt:.2f} | {n / dt:.0f} |", flush=True)
    finally:
        proc.terminate()
        proc.wait()
    tool = subprocess.run([INFERD, "perplexity", *model, "-f", TEXT, "-c", str(a.context), "--chunks",
                           str(a.chunks), "-t", "2", "--json"], check=True, capture_output=True, text=True)
    ref = json.loads(tool.stdout.strip().splitlines()[-1])
    print(f"\nperplexity from the server's echo logprobs: {math.exp(nll / scored):.6f} ({scored} tokens); "
          f"inferd perplexity: {ref['perplexity']:.6f} ({ref['scored_tokens']} tokens)")


if __name__ == "__main__":
    main()
