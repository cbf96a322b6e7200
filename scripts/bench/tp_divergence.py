#!/usr/bin/env python3
"""How far apart two ways of computing the same model land (docs/parallelism.md, "How close T = 2
is to T = 1"): greedy answers with logprobs from two servers, compared token by token. Prints the
tokens compared, max |logprob A - logprob B| over the tokens before each answer's first
divergence, and how many answers diverged.

  scripts/bench/tp_divergence.py                          # T = 1 against T = 2 (mpirun -np 2)
  scripts/bench/tp_divergence.py --pipeline               # P = 1 against P = 2 stages
  scripts/bench/tp_divergence.py --other-binary build-asan/inferd   # two builds, both T = 1
  scripts/bench/tp_divergence.py -- --matmul f32 --kv-cache-dtype f32   # serve flags for both
"""
import argparse
import json
import os
import signal
import subprocess
import urllib.request

from serve_util import INFERD, free_port, wait_healthy

SHARED = "The history of the city goes back many centuries, and its old town is full of " * 6
PROMPTS = [SHARED + "churches.", SHARED + "markets and", "Once upon a time", "The three primary colours are",
           "My favourite food is", "The capital of France", "def fibonacci(n):"]
MPI = ["mpirun", "--oversubscribe", "--allow-run-as-root", "--mca", "btl", "self,vader", "--mca",
       "btl_vader_single_copy_mechanism", "none"]


def serve(binary, ranks, flags, pipeline=False):
    port = free_port()
    cmd = [binary, "serve", "--port", str(port), "-t", "1", "--kv-cache-memory", "64MiB", *flags]
    env = dict(os.environ)
    if ranks > 1:
        cmd = MPI + ["-np", str(ranks)] + cmd + [
            "--pipeline-parallel-size" if pipeline else "--tensor-parallel-size", str(ranks)]
        env["OMPI_MCA_memory"] = "^patcher"  # harmless in Release; needed by an ASan build
        env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":detect_leaks=0"
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env=env)
    wait_healthy(proc, port, timeout=180, what=" ".join(cmd))
    return proc, port


def answers(binary, ranks, flags, max_tokens, pipeline=False):
    proc, port = serve(binary, ranks, flags, pipeline)
    try:
        out = []
        for p in PROMPTS:
            body = {"prompt": p, "max_tokens": max_tokens, "temperature": 0, "logprobs": 1}
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=300) as r:
                out.append(json.loads(r.read())["choices"][0]["logprobs"])
        return out
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=INFERD)
    ap.add_argument("--other-binary", help="compare with this build at T = 1 instead of T = 2")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--pipeline", action="store_true", help="P = ranks stages instead of T = ranks")
    ap.add_argument("flags", nargs="*", help="serve flags for both sides (after --)")
    a = ap.parse_args()
    first = answers(a.binary, 1, a.flags, a.max_tokens)
    if a.other_binary:
        second, what = answers(a.other_binary, 1, a.flags, a.max_tokens), f"{a.binary} vs {a.other_binary}, T = 1"
    else:
        second = answers(a.binary, a.ranks, a.flags, a.max_tokens, a.pipeline)
        what = f"P = 1 vs P = {a.ranks}" if a.pipeline else f"T = 1 vs T = {a.ranks}"
    worst, diverged, n = 0.0, 0, 0
    for x, y in zip(first, second):
        for tx, ty, lx, ly in zip(x["tokens"], y["tokens"], x["token_logprobs"], y["token_logprobs"]):
            if tx != ty:
                diverged += 1
                break
            worst = max(worst, abs(lx - ly))
            n += 1
    print(f"{what} {' '.join(a.flags) or '(default mode)'}: {n} tokens compared, max |d logprob| {worst:.3g}, "
          f"{diverged} of {len(PROMPTS)} answers diverged")


if __name__ == "__main__":
    main()
