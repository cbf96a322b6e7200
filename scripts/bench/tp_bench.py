#!/usr/bin/env python3
"""Tensor parallelism on this machine (docs/parallelism.md, BENCHMARKS.md): the same 2 cores used
as one process with 2 threads (T = 1) or as two MPI ranks of 1 thread (T = 2), on one model.

- pp512 and tg128 (`inferd bench latency`), with rank 0's share of each phase spent in collectives;
- batched decode: `inferd bench serve` (random prompts of 64 tokens, 64 output tokens, 8 in
  flight) against `inferd serve` at T = 1 and T = 2: output tokens/s and TPOT p50.

  scripts/bench/tp_bench.py [-m MODEL] [-r 5]
MODEL defaults to the Qwen2.5-0.5B shapes at Q8_0 (scripts/peer/make_models.py --types q8_0).
P = 2: two pipeline stages of 1 thread each.
"""
import argparse
import json
import os
import signal
import subprocess
import tempfile
from pathlib import Path

from serve_util import INFERD, free_port, wait_healthy

MPI = ["mpirun", "--oversubscribe", "--allow-run-as-root", "--mca", "btl", "self,vader", "--mca",
       "btl_vader_single_copy_mechanism", "none"]


def with_ranks(cmd, ranks, split="--tensor-parallel-size"):
    return cmd if ranks == 1 else MPI + ["-np", str(ranks)] + cmd + [split, str(ranks)]


def latency(model, ranks, reps, split):
    cmd = [INFERD, "bench", "latency", "-m", model, "-t", str(2 // ranks), "-p", "512", "-n", "128", "-r", str(reps),
           "--json"]
    p = subprocess.run(with_ranks(cmd, ranks, split), capture_output=True, text=True, check=True, timeout=1800)
    return json.loads([line for line in p.stdout.splitlines() if line.startswith("{")][0])


def batched(model, ranks, split):
    port = free_port()
    cmd = with_ranks([INFERD, "serve", "-m", model, "--port", str(port), "-t", str(2 // ranks), "--kv-cache-memory",
                      "256MiB", "--max-num-seqs", "8"], ranks, split)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_healthy(proc, port, what=" ".join(cmd))
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "r.json")
            subprocess.run([INFERD, "bench", "serve", "--base-url", f"http://127.0.0.1:{port}", "--dataset", "random",
                            "--input-len", "64", "--output-len", "64", "--num-prompts", "24", "--max-concurrency", "8",
                            "--request-rate", "inf", "--tokenizer", model, "--no-progress", "--result-json", out],
                           check=True, capture_output=True, timeout=1800)
            with open(out) as f:
                return json.load(f)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=str(Path(os.environ.get("INFERD_PEER_DIR", Path.home() / ".cache/inferd-peer"))
                                                  / "models" / "qwen2.5-0.5b-shapes-q8_0.gguf"))
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    a = ap.parse_args()
    if not Path(a.model).exists():
        raise SystemExit(f"tp_bench: {a.model}: no such file (scripts/peer/make_models.py --types q8_0 writes it)")
    print(f"model {Path(a.model).name}; {os.cpu_count()} CPUs")
    print("| layout | pp512 t/s | tg128 t/s | batched decode out t/s (8 in flight) | TPOT p50 ms | "
          "waits in collectives / messages: pp / tg |")
    print("|---|---|---|---|---|---|")
    rows = {}
    layouts = ((1, "T = 1, 2 threads", None), (2, "T = 2 x 1 thread", "--tensor-parallel-size"),
               (3, "P = 2 x 1 thread", "--pipeline-parallel-size"))
    for key, name, split in layouts:
        ranks = 1 if key == 1 else 2
        lat = latency(a.model, ranks, a.repetitions, split)
        b = batched(a.model, ranks, split)
        share = (f"{100 * lat['prompt_collective_share']:.1f} % / {100 * lat['generation_collective_share']:.1f} %"
                 if ranks > 1 else "-")
        rows[key] = (lat["prompt_tokens_per_second"], lat["generation_tokens_per_second"], b["output_throughput"])
        print(f"| {name} | {lat['prompt_tokens_per_second']:.1f} | {lat['generation_tokens_per_second']:.1f} | "
              f"{b['output_throughput']:.1f} | {b['median_tpot_ms']:.1f} | {share} |", flush=True)
    r1 = rows[1]
    for key, label in ((2, "T = 2"), (3, "P = 2")):
        r = rows[key]
        print(f"{label} / T = 1: pp {r[0] / r1[0]:.2f}x, tg {r[1] / r1[1]:.2f}x, batched decode {r[2] / r1[2]:.2f}x")


if __name__ == "__main__":
    main()
