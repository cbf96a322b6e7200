#!/usr/bin/env python3
"""Prefill of several inferd binaries on one model, interleaved round by round (no peer).

    python3 scripts/bench/prefill_ab.py [--rounds 12] [--prompt 512] MODEL BASELINE BINARY ...

Each round runs `BINARY bench latency -p N -n 0 -r 2` of every binary, in an order reversed every
other round, so that the VM's slow minutes fall on each alike; prints per binary the median and
best prompt tokens/s and its per-round ratios to the first binary (BASELINE) with their median.
MODEL: a .gguf path, or a name of the Qwen2.5-0.5B-shaped files (q8_0, f16, ...) of
scripts/peer/make_models.py. For llama.cpp in the same run use prefill_length.py.
"""
import argparse
import json
import os
import statistics
import subprocess

PEER_DIR = os.environ.get("INFERD_PEER_DIR", os.path.expanduser("~/.cache/inferd-peer"))


def prompt_tps(binary, model, n):
    out = subprocess.run([binary, "bench", "latency", "-m", model, "-t", "2", "-p", str(n), "-n", "0", "-r", "2",
                          "--json"], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["prompt_tokens_per_second"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("model")
    ap.add_argument("binaries", nargs="+")
    a = ap.parse_args()
    model = a.model
    if not model.endswith(".gguf"):
        model = os.path.join(PEER_DIR, "models", f"qwen2.5-0.5b-shapes-{model}.gguf")
    got = {b: [] for b in a.binaries}
    for r in range(a.rounds):
        for b in a.binaries if r % 2 == 0 else a.binaries[::-1]:
            got[b].append(prompt_tps(b, model, a.prompt))
    base = got[a.binaries[0]]
    print(f"| binary | pp{a.prompt} median | best | / baseline, median of rounds | per round |")
    print("|---|---|---|---|---|")
    for b in a.binaries:
        ratios = [x / y for x, y in zip(got[b], base)]
        print(f"| {b} | {statistics.median(got[b]):.1f} | {max(got[b]):.1f} | {statistics.median(ratios):.3f} | "
              + " ".join(f"{x:.2f}" for x in ratios) + " |")


if __name__ == "__main__":
    main()
