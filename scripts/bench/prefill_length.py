#!/usr/bin/env python3
"""Prefill throughput by prompt length against llama.cpp: where attention's share of a step grows.

For each round, model and length: `inferd bench latency -p N -n 0` (and, with --baseline, a second
inferd binary, e.g. one built before a change), then `llama-bench -p N -n 0` with flash attention
off and on; the peer's better figure is the one compared, and the table says which it was.
Interleaved so that the VM's drift hits every column alike. Run from the repository root after
building; the models are the Qwen2.5-0.5B-shaped files of scripts/peer/make_models.py.

  python3 scripts/bench/prefill_length.py --models q8_0 bf16 f16 --lengths 512 4096 --rounds 2
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

PEER_DIR = os.environ.get("INFERD_PEER_DIR", os.path.expanduser("~/.cache/inferd-peer"))


def inferd_pp(binary, model, n, reps):
    out = subprocess.run([binary, "bench", "latency", "-m", model, "-t", "2", "-p", str(n), "-n", "0",
                          "-r", str(reps), "--json"], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["prompt_tokens_per_second"]


def peer_pp(model, n, reps, fa):
    out = subprocess.run([os.path.join(PEER_DIR, "bin", "llama-bench"), "-m", model, "-t", "2", "-p", str(n),
                          "-n", "0", "-r", str(reps), "-fa", str(fa), "-o", "json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)[0]["avg_ts"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["q8_0", "bf16", "f16"])
    ap.add_argument("--lengths", nargs="+", type=int, default=[512, 4096])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=1, help="repetitions per measurement (means)")
    ap.add_argument("--inferd", default="build/inferd")
    ap.add_argument("--baseline", help="a second inferd binary measured alongside")
    a = ap.parse_args()
    cols = ["round", "weights", "prompt", "inferd"] + (["baseline", "inferd / baseline"] if a.baseline else [])
    cols += ["llama.cpp fa off", "llama.cpp fa on", "inferd / best llama.cpp"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    runs = {}  # (weights, prompt) -> per round: ours, baseline, best llama.cpp
    for r in range(1, a.rounds + 1):
        for m in a.models:
            path = os.path.join(PEER_DIR, "models", f"qwen2.5-0.5b-shapes-{m}.gguf")
            if not os.path.exists(path):
                sys.exit(f"missing {path}: run scripts/peer/make_models.py (and inferd quantize for bf16)")
            for n in a.lengths:
                ours = inferd_pp(a.inferd, path, n, a.reps)
                row = [str(r), m, str(n), f"{ours:.1f}"]
                if a.baseline:
                    base = inferd_pp(a.baseline, path, n, a.reps)
                    row += [f"{base:.1f}", f"{ours / base:.2f}x"]
                off, on = peer_pp(path, n, a.reps, 0), peer_pp(path, n, a.reps, 1)
                row += [f"{off:.1f}", f"{on:.1f}", f"{ours / max(off, on):.2f}x"]
                print("| " + " | ".join(row) + " |", flush=True)
                runs.setdefault((m, n), []).append((ours, base if a.baseline else None, max(off, on)))
    # The VM's other tenants only ever slow a run down: the best of the rounds, column by column, is
    # the steadiest figure, and the median of the per-round ratios the one to set beside it.
    print()
    print("| weights | prompt | inferd best | baseline best | llama.cpp best | inferd / baseline (bests; median) "
          "| inferd / llama.cpp (bests; median) |")
    print("|---|---|---|---|---|---|---|")
    for (m, n), rs in runs.items():
        best = [max(x[i] for x in rs) if rs[0][i] is not None else None for i in range(3)]
        vs_base = (f"{best[0] / best[1]:.2f}x; {statistics.median(x[0] / x[1] for x in rs):.2f}x"
                   if a.baseline else "-")
        vs_peer = f"{best[0] / best[2]:.2f}x; {statistics.median(x[0] / x[2] for x in rs):.2f}x"
        base_best = f"{best[1]:.1f}" if a.baseline else "-"
        print(f"| {m} | {n} | {best[0]:.1f} | {base_best} | {best[2]:.1f} | {vs_base} | {vs_peer} |")


if __name__ == "__main__":
    main()
