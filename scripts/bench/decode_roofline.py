#!/usr/bin/env python3
"""Single-sequence decode against the memory-bandwidth limit, measured in one run.

    python3 scripts/bench/decode_roofline.py [MODEL.gguf ...]

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


def main():
    models = [Path(m) for m in sys.argv[1:]] or [PEER / "models" / f"qwen2.5-0.5b-shapes-{t}.gguf"
                                                 for t in ("q8_0", "q4_0", "f16")]
    print("| model | bytes per token (MB) | tg128 tok/s | GB/s read | bandwidth GB/s (before, after) | share of the limit |")
    print("|---|---|---|---|---|---|")
    for m in models:
        before = bandwidth()
        p = subprocess.run([str(ROOT / "build" / "inferd"), "bench", "latency", "-m", str(m), "-p", "0", "-n", "128",
                            "-r", "3", "-t", "2", "--json"], check=True, capture_output=True, text=True)
        tg = json.loads(p.stdout)["generation_tokens_per_second"]
        after = bandwidth()
        per_token = tensor_bytes(m)
        read = tg * per_token / 1e9
        bw = statistics.mean([before, after])
        print(f"| {m.name} | {per_token / 1e6:.0f} | {tg:.1f} | {read:.1f} | {bw:.1f} ({before:.1f}, {after:.1f}) | "
              f"{100 * read / bw:.0f} % |")


if __name__ == "__main__":
    main()
