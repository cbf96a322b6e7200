#!/usr/bin/env python3
"""Single-sequence decode against the memory-bandwidth limit, measured in one run.

    python3 scripts/bench/decode_roofline.py [--rounds N] [MODEL.gguf ...]

For each model: the machine's read bandwidth (build/kernels_bench BM_ReadBandwidth, before and
after), inferd's tg128 (`inferd bench latency -p 0 -n 128`), the bytes a decode step reads (the
model's weight bytes as `inferd info` reports them: every weight once, the tied embedding as the
LM head; the embedding lookup's one row and per-row scale vectors are negligible), and so the share of the bandwidth limit reached:
    share = tg tokens/s x bytes per token / bandwidth.
Defaults to the Qwen2.5-0.5B-shaped models of scripts/peer/make_models.py.
"""
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEER = Path(os.environ.get("INFERD_PEER_DIR", Path.home() / ".cache" / "inferd-peer"))


def bandwidth():
    p = subprocess.run([str(ROOT / "build" / "kernels_bench"), "--benchmark_filter=BM_ReadBandwidth",
                        "--benchmark_min_time=0.5", "--benchmark_format=json"], check=True, capture_output=True,
                       text=True)
    return json.loads(p.stdout)["benchmarks"][0]["GB/s"]  # the counter is already in GB


def tensor_bytes(path):
    # `inferd info` reads every format inferd stores (gguf-py does not know inferd's own types).
    p = subprocess.run([str(ROOT / "build" / "inferd"), "info", "-m", str(path)], check=True, capture_output=True,
                       text=True)
    return json.loads(p.stdout)["weight_bytes"]


def tg128(model):
    p = subprocess.run([str(ROOT / "build" / "inferd"), "bench", "latency", "-m", str(model), "-p", "0", "-n", "128",
                        "-r", "3", "-t", "2", "--json"], check=True, capture_output=True, text=True)
    return json.loads(p.stdout)["generation_tokens_per_second"]


def main():
    import argparse
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*")
    ap.add_argument("--rounds", type=int, default=1,
                    help="probe and decode alternate this many times per model (probe, tg, probe, tg, ..., "
                         "probe); the table then compares the best of each and the medians of each: on a "
                         "shared machine other tenants only ever slow a run down")
    args = ap.parse_args()
    models = [Path(m) for m in args.models] or [PEER / "models" / f"qwen2.5-0.5b-shapes-{t}.gguf"
                                                for t in ("q8_0", "q4_0", "f16")]
    if args.rounds == 1:
        print("| model | bytes per token (MB) | tg128 tok/s | GB/s read | bandwidth GB/s (before, after) | "
              "share of the limit |")
        print("|---|---|---|---|---|---|")
    else:
        print("| model | bytes per token (MB) | tg128 tok/s (each round) | probe GB/s (each) | GB/s read, best | "
              "probe, best | share, best of each | share, medians |")
        print("|---|---|---|---|---|---|---|---|")
    for m in models:
        per_token = tensor_bytes(m)
        probes = [bandwidth()]
        tgs = []
        for _ in range(args.rounds):
            tgs.append(tg128(m))
            probes.append(bandwidth())
        if args.rounds == 1:
            read = tgs[0] * per_token / 1e9
            bw = statistics.mean(probes)
            print(f"| {m.name} | {per_token / 1e6:.0f} | {tgs[0]:.1f} | {read:.1f} | {bw:.1f} ({probes[0]:.1f}, "
                  f"{probes[1]:.1f}) | {100 * read / bw:.0f} % |")
            continue
        reads = [t * per_token / 1e9 for t in tgs]
        print(f"| {m.name} | {per_token / 1e6:.0f} | {', '.join(f'{t:.1f}' for t in tgs)} | "
              f"{', '.join(f'{b:.0f}' for b in probes)} | {max(reads):.1f} | {max(probes):.1f} | "
              f"{100 * max(reads) / max(probes):.0f} % | "
              f"{100 * statistics.median(reads) / statistics.median(probes):.0f} % |", flush=True)


if __name__ == "__main__":
    main()
