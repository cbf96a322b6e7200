#!/usr/bin/env python3
"""Engine figures for BENCHMARKS.md, measured with `inferd generate` on the default model.

    python3 scripts/bench/engine_bench.py concurrency   # decode tokens/s at 1, 4, 16, 64 sequences
    python3 scripts/bench/engine_bench.py policies      # TTFT under decode-first vs prefill-first

concurrency: N requests of 32 prompt tokens, 32 generated (ignore_eos), all submitted at once;
decode tokens/s counts the steps where every request computes one generated token.
policies: a mixed offline workload (8 prompts of 256 tokens + 24 prompts of 16 tokens, 48 output
tokens each) with a 128-token step budget, run under each policy; TTFT is per request from the
start of the run.
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INFERD = os.path.join(ROOT, "build", "inferd")


def generate(lines, *flags):
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "in.jsonl"), os.path.join(d, "out.jsonl")
        with open(src, "w") as f:
            f.writelines(json.dumps(l) + "\n" for l in lines)
        p = subprocess.run([INFERD, "generate", "-i", src, "-o", dst, "-t", "2", *flags],
                           capture_output=True, text=True, check=True)
        with open(dst) as f:
            results = [json.loads(l) for l in f]
    return results, p.stderr


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def concurrency():
    print("| sequences | decode tokens/s | vs 1 sequence | decode step ms | whole run tokens/s (prefill included) | scheduler + bookkeeping share |")
    print("|---|---|---|---|---|---|")
    base = None
    for n in (1, 4, 16, 64):
        lines = [{"prompt_ids": [(i * 7 + k) % 49000 + 100 for k in range(32)], "max_tokens": 32, "ignore_eos": True}
                 for i in range(n)]
        _, err = generate(lines, "--kv-cache-memory", "512MiB", "--max-num-seqs", "64")
        overall = float(re.search(r"([\d.]+) generated tokens/s", err).group(1))
        m = re.search(r"decode: \d+ decode-only steps, ([\d.]+) ms per step, ([\d.]+) tokens/s", err)
        step, tps = float(m.group(1)), float(m.group(2))
        share = re.search(r"bookkeeping ([\d.]+)%", err).group(1)
        base = base or tps
        print(f"| {n} | {tps:.1f} | {tps / base:.2f}x | {step:.1f} | {overall:.1f} | {share} % |")


def policies():
    lines = [{"prompt_ids": [(i * 13 + k) % 49000 + 100 for k in range(256)], "max_tokens": 48, "ignore_eos": True}
             for i in range(8)]
    lines += [{"prompt_ids": [(i * 17 + k) % 49000 + 100 for k in range(16)], "max_tokens": 48, "ignore_eos": True}
              for i in range(24)]
    print("| policy | TTFT p50 (s) | TTFT p99 (s) | short-prompt TTFT p50 (s) | long-prompt TTFT p50 (s) | E2E p50 (s) | generated tokens/s |")
    print("|---|---|---|---|---|---|---|")
    for policy in ("decode-first", "prefill-first", "adaptive"):
        res, err = generate(lines, "--kv-cache-memory", "512MiB", "--max-num-batched-tokens", "128",
                            "--max-prefill-tokens", "128", "--schedule-policy", policy)
        ttft = [r["ttft_s"] for r in res]
        tps = float(re.search(r"([\d.]+) generated tokens/s", err).group(1))
        print(f"| {policy} | {pct(ttft, 50):.2f} | {pct(ttft, 99):.2f} | {statistics.median(ttft[8:]):.2f} | "
              f"{statistics.median(ttft[:8]):.2f} | {pct([r['e2e_s'] for r in res], 50):.2f} | {tps:.1f} |")


if __name__ == "__main__":
    {"concurrency": concurrency, "policies": policies}[sys.argv[1]]()
