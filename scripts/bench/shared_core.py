#!/usr/bin/env python3
"""Prefill and decode while another process keeps one of the machine's CPUs busy.

    python3 scripts/bench/shared_core.py [--rounds N] [--baseline OLD_INFERD] [--quiet] [MODEL.gguf ...]

A served model rarely has its cores to itself: the server's I/O threads, a sidecar, another
tenant of the VM. This runs a busy loop pinned to the last CPU (`taskset`), then, in interleaved
rounds, `inferd bench latency -t 2 -p 128 -n 32 -r 2` (and the same with --baseline, an older
inferd binary, for a before/after) and the peer's `llama-bench` with the same sizes and threads.
--quiet leaves the busy loop out, for the uncontended figures of the same binaries.
Prints one markdown row per round, engine and model (tokens/s: pp128, tg32).
Defaults to SmolLM2-135M Q4_1 and the Qwen2.5-0.5B-shaped Q8_0 of scripts/peer/make_models.py.
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEER = Path(os.environ.get("INFERD_PEER_DIR", Path.home() / ".cache" / "inferd-peer"))


def inferd(binary, model):
    p = subprocess.run([str(binary), "bench", "latency", "-m", str(model), "-t", "2", "-p", "128", "-n", "32",
                        "-r", "2", "--json"], check=True, capture_output=True, text=True)
    d = json.loads(p.stdout)
    return d["prompt_tokens_per_second"], d["generation_tokens_per_second"]


def llama(model):
    p = subprocess.run([str(PEER / "bin" / "llama-bench"), "-m", str(model), "-t", "2", "-p", "128", "-n", "32",
                        "-r", "2", "-o", "json"], check=True, capture_output=True, text=True)
    rows = json.loads(p.stdout)
    pp = next(r["avg_ts"] for r in rows if r["n_prompt"] > 0)
    tg = next(r["avg_ts"] for r in rows if r["n_gen"] > 0)
    return pp, tg


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--baseline", help="an older inferd binary, measured in the same rounds")
    ap.add_argument("--quiet", action="store_true", help="no busy loop: the uncontended figures")
    args = ap.parse_args()
    models = [Path(m) for m in args.models] or [PEER / "models" / "smollm2-135m-q4_1.gguf",
                                                PEER / "models" / "qwen2.5-0.5b-shapes-q8_0.gguf"]
    engines = [("inferd", lambda m: inferd(ROOT / "build" / "inferd", m))]
    if args.baseline:
        engines.insert(0, ("inferd (baseline)", lambda m: inferd(args.baseline, m)))
    if (PEER / "bin" / "llama-bench").exists():
        engines.append(("llama.cpp", llama))
    else:
        print(f"no peer at {PEER / 'bin' / 'llama-bench'} (scripts/peer/build_llama_cpp.sh): inferd only",
              file=sys.stderr)
    hog = None
    if not args.quiet:
        cpu = os.cpu_count() - 1
        hog = subprocess.Popen(["taskset", "-c", str(cpu), "sh", "-c", "while :; do :; done"])
        print(f"busy loop on CPU {cpu}", file=sys.stderr)
    try:
        print("| round | model | engine | pp128 tok/s | tg32 tok/s |")
        print("|---|---|---|---|---|")
        for r in range(1, args.rounds + 1):
            for m in models:
                for name, run in engines:
                    pp, tg = run(m)
                    print(f"| {r} | {m.name} | {name} | {pp:.1f} | {tg:.1f} |", flush=True)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()


if __name__ == "__main__":
    main()
