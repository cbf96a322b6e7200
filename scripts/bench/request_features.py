#!/usr/bin/env python3
"""What two request features cost or save, through the server on the default model:

- Predicted outputs (OpenAI's `prediction`): an edit of a source file, answered greedily with and
  without the original file as the prediction, and the same request predicted by its own answer
  (the best a prediction can do). The answers must be identical; prints decode seconds, tokens/s
  and the accepted / rejected prediction tokens. The server runs without a speculative config.
- Beam search (`use_beam_search`, n beams) against greedy decoding of the same length, on a
  second server with prefix caching on (the default; each beam step's request finds its prompt's
  full blocks there).

Rounds interleave the forms. Prints Markdown tables.

    python3 scripts/bench/request_features.py [--model M] [--rounds 3] [--max-tokens 200]
"""
import argparse
import json
import os
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import start_server  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE = os.path.join(ROOT, "scripts", "bench", "serve_util.py")


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=900) as r:
        return json.loads(r.read()), time.time() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=200)
    a = ap.parse_args()
    model = ["-m", a.model] if a.model else []
    proc, port = start_server(*model, "--no-prefix-caching")
    try:
        print(f"CPU: {open('/proc/cpuinfo').read().split('model name')[1].split(':')[1].splitlines()[0].strip()}")
        with open(SOURCE) as f:
            code = "".join(f.readlines()[:30])
        messages = [{"role": "user", "content": "Rename the function free_port to unused_port in this code and "
                                                "give back the whole code:\n\n" + code}]
        base = {"messages": messages, "max_tokens": a.max_tokens, "temperature": 0}
        first, _ = post(port, "/v1/chat/completions", base)
        answer = first["choices"][0]["message"]["content"]
        forms = {"no prediction": {}, "the original file": {"prediction": {"type": "content", "content": code}},
                 "its own answer": {"prediction": {"type": "content", "content": answer}}}
        print("\n| round | prediction | completion tokens | seconds | tokens/s | accepted | rejected |")
        print("|---|---|---|---|---|---|---|")
        for rnd in range(a.rounds):
            for name, extra in forms.items():
                r, dt = post(port, "/v1/chat/completions", {**base, **extra})
                assert r["choices"][0]["message"]["content"] == answer, f"{name}: the answer changed"
                n = r["usage"]["completion_tokens"]
                d = r["usage"].get("completion_tokens_details") or {}
                print(f"| {rnd + 1} | {name} | {n} | {dt:.2f} | {n / dt:.1f} | "
                      f"{d.get('accepted_prediction_tokens', '-')} | {d.get('rejected_prediction_tokens', '-')} |",
                      flush=True)
    finally:
        proc.terminate()
        proc.wait()
    proc, port = start_server(*model)
    try:
        print("\n| round | decoding | tokens per answer | answers | seconds | seconds / greedy |")
        print("|---|---|---|---|---|---|")
        prompt = {"prompt": "The history of the printing press", "max_tokens": 32, "ignore_eos": True}
        for rnd in range(a.rounds):
            _, greedy = post(port, "/v1/completions", {**prompt, "temperature": 0})
            print(f"| {rnd + 1} | greedy | 32 | 1 | {greedy:.2f} | 1.00 |", flush=True)
            for width in (2, 4):
                r, dt = post(port, "/v1/completions", {**prompt, "n": width, "use_beam_search": True})
                assert len({c["text"] for c in r["choices"]}) == width
                print(f"| {rnd + 1} | beam search, {width} beams | 32 | {width} | {dt:.2f} | {dt / greedy:.2f} |",
                      flush=True)
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    main()
