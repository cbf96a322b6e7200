#!/usr/bin/env python3
"""16 concurrent chat requests under a nested JSON schema, then the same 16 unconstrained with
each request's max_tokens set to its constrained answer's length (ignore_eos), against an
OpenAI-compatible server: inferd serve or llama.cpp's llama-server. Prints the decode throughput
of both runs (completion tokens / wall time) and their ratio, median of the rounds.

    scripts/bench/constrained_peer.py --base-url http://127.0.0.1:8000 [--rounds 3]

Start the servers with 16 sequences at once and 2 threads, e.g.
    build/inferd serve -t 2 --port 8000 --max-num-seqs 16
    ~/.cache/inferd-peer/bin/llama-server -m ~/.cache/inferd-peer/models/smollm2-135m-q4_1.gguf \\
        -t 2 -np 16 -c 32768 --port 8001
"""
import argparse
import json
import statistics
import threading
import time
import urllib.request

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"},
                                                     "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["street", "city", "zip"], "additionalProperties": False},
        "hobbies": {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"}, "years": {"type": "integer"}}, "required": ["name", "years"]}},
    },
    "required": ["name", "age", "address", "hobbies"],
    "additionalProperties": False,
}


def post(base, body):
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def run(base, constrained, lengths):
    results = [None] * 16

    def one(i):
        body = {"model": "", "messages": [{"role": "user", "content": f"Describe person number {i} as JSON."}],
                "temperature": 1.0, "seed": i}
        if constrained:
            body["max_tokens"] = 160
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}
        else:
            body["max_tokens"] = lengths[i]
            body["ignore_eos"] = True
        results[i] = post(base, body)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    tokens = [r["usage"]["completion_tokens"] for r in results]
    valid = 0  # answers that ended (not cut by max_tokens) and parse
    for r in results:
        try:
            json.loads(r["choices"][0]["message"]["content"])
            valid += 1
        except (ValueError, TypeError):
            assert r["choices"][0]["finish_reason"] == "length", r["choices"][0]
    return sum(tokens) / wall, tokens, valid


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    run(a.base_url, False, [8] * 16)  # warm-up
    ratios, cons, uncons = [], [], []
    for k in range(a.rounds):
        c, lengths, valid = run(a.base_url, True, None)
        u, u_lengths, _ = run(a.base_url, False, lengths)
        cons.append(c)
        uncons.append(u)
        ratios.append(c / u)
        print(f"round {k}: constrained {c:.1f} tok/s ({sum(lengths)} tokens; {valid}/16 ended and parse, the rest cut by max_tokens), "
              f"unconstrained {u:.1f} tok/s ({sum(u_lengths)} tokens), ratio {c / u:.3f}", flush=True)
    print(f"median: constrained {statistics.median(cons):.1f} tok/s, unconstrained "
          f"{statistics.median(uncons):.1f} tok/s, ratio {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
