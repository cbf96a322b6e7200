#!/usr/bin/env python3
"""--batch-window off / auto / fixed windows (issue 21, part 1) on Poisson and bursty (gamma)
arrivals at fractions of capacity, with `inferd bench serve` against `inferd serve` on the
default model. Capacity is measured first (all requests at once: requests/s). Prints one row per
(arrivals, load, window): TTFT p50 / p99, TPOT p50, goodput (requests/s within --slo) and the
window the server reported (`inferd:batch_window_seconds` after the run).

  python3 scripts/bench/batch_window.py [--windows off,auto,20,100] [--loads 0.5,0.8,1.0]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import INFERD, start_server  # noqa: E402


def bench(port, rate, burstiness, args, out):
    cmd = [INFERD, "bench", "serve", "--base-url", f"http://127.0.0.1:{port}", "--dataset", "random",
           "--input-len", str(args.input_len), "--output-len", str(args.output_len), "--num-prompts",
           str(args.num_prompts), "--request-rate", str(rate), "--burstiness", str(burstiness), "--seed",
           str(args.seed), "--slo", args.slo, "--result-json", out, "--no-progress"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)


def gauge(port, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    m = re.search(r"^" + re.escape(name) + r"\{[^}]*\} ([0-9.eE+-]+)$", text, re.M)
    return float(m.group(1)) if m else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--windows", default="off,auto,20,100")
    ap.add_argument("--loads", default="0.5,0.8,1.0")
    ap.add_argument("--burstiness", default="1,0.25")
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--num-prompts", type=int, default=100)
    ap.add_argument("--slo", default="ttft=1s,tpot=250ms")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    proc, port = start_server()
    try:
        cap = bench(port, "inf", 1, args, os.path.join(tmp, "cap.json"))["request_throughput"]
    finally:
        proc.terminate()
        proc.wait()
    print(f"capacity: {cap:.2f} requests/s (random {args.input_len} in / {args.output_len} out, all at once); "
          f"{args.num_prompts} requests per run; goodput SLO {args.slo}")
    print("| arrivals | load | window | TTFT p50 (ms) | TTFT p99 (ms) | TPOT p50 (ms) | goodput (req/s) | "
          "window reported (ms) |")
    print("|---|---|---|---|---|---|---|---|")
    rows = {}
    for window in args.windows.split(","):
        proc, port = start_server("--batch-window", window)
        try:
            bench(port, "inf", 1, args, os.path.join(tmp, "warm.json"))  # warm-up, not reported
            for b in args.burstiness.split(","):
                for load in args.loads.split(","):
                    r = bench(port, f"{cap * float(load):.3f}", b, args, os.path.join(tmp, "r.json"))
                    w = gauge(port, "inferd:batch_window_seconds")
                    rows[(b, load, window)] = (r["median_ttft_ms"], r["p99_ttft_ms"], r["median_tpot_ms"],
                                               r["request_goodput"], w * 1e3)
        finally:
            proc.terminate()
            proc.wait()
    for b in args.burstiness.split(","):
        for load in args.loads.split(","):
            for window in args.windows.split(","):
                p50, p99, tpot, good, w = rows[(b, load, window)]
                kind = "Poisson" if float(b) == 1 else f"gamma (shape {b})"
                print(f"| {kind} | {float(load):.0%} | {window} | {p50:.0f} | {p99:.0f} | {tpot:.0f} | {good:.2f} | "
                      f"{w:.1f} |")


if __name__ == "__main__":
    main()
