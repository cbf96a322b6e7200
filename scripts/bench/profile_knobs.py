#!/usr/bin/env python3
"""The second sweep behind `inferd serve --profile` (issue 21, part 3): the knobs the first sweep
(profile_sweep.py: policy x token budget) left alone, each on top of the scenario's profile:

  --max-num-seqs 4 / 16 / 64     on the scenario's workload of profile_sweep.py
  prefix caching on / off        on the scenario's follow-up traffic (below)
  --session-ttl 0 / 300 / 600    the same traffic, each conversation under one session_id
                                 (`inferd bench serve --session-ids`)

Follow-up traffic: chat and code are conversations (`--dataset multi-turn`, 3 turns, each turn
the scenario's prompt length, at the scenario's concurrency); summarize, long-context and batch
are one-shot requests (the workload of the first sweep), where neither prefix caching nor session
pins have anything to reuse: the script says so instead of running them. The follow-up traffic
is 2 x the scenario's concurrency in requests (chat: 5 conversations of 3 turns, code: 2), run
with --kv-cache-memory 384MiB (about 17,000 tokens of SmolLM2's f16 KV), so that conversations
compete for KV blocks and a cached prefix can be lost to other traffic. Figure of merit as
the first sweep: goodput within the scenario's SLO (TTFT p99 breaking ties), output tokens/s for
batch. Prints one markdown table.

  python3 scripts/bench/profile_knobs.py [--scenarios chat,code,...] [--json knobs.json]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_sweep import SCENARIOS, merit, run  # noqa: E402
from serve_util import INFERD, start_server  # noqa: E402

KV = "384MiB"
CONVERSATIONS = {"chat", "code"}


def bench(port, scenario, tmp, follow_up, sessions, seed):
    conc = SCENARIOS[scenario][2]
    dataset = ["--endpoint", "/v1/chat/completions", "--dataset", "multi-turn", "--turns", "3",
               "--num-prompts", str(2 * conc)] if follow_up else None
    return run(port, scenario, tmp, seed=seed, dataset=dataset, extra=["--session-ids"] if sessions else [])


def configs(scenario):
    """(knob, value, server flags, follow-up traffic, session ids) for one scenario."""
    out = [("max-num-seqs", v, ["--max-num-seqs", str(v)], False, False) for v in (4, 16, 64)]
    if scenario in CONVERSATIONS:
        out += [("prefix caching", "off", ["--no-prefix-caching"], True, False),
                ("prefix caching", "on", [], True, False)]
        out += [("session TTL", v, ["--session-ttl", str(v)], True, True) for v in (0, 300, 600)]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--json")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp()
    rows = []
    for s in args.scenarios.split(","):
        for knob, value, flags, follow_up, sessions in configs(s):
            kv = ["--kv-cache-memory", KV] if follow_up else []
            proc, port = start_server("--profile", s, "--max-model-len", "8192", *kv, *flags)
            try:
                subprocess.run([INFERD, "bench", "serve", "--base-url", f"http://127.0.0.1:{port}", "--input-len",
                                "128", "--output-len", "8", "--num-prompts", "4", "--seed", "99", "--no-progress"],
                               check=True, stdout=subprocess.DEVNULL)  # warm-up on other prompts
                r = bench(port, s, tmp, follow_up, sessions, seed=3 + list(SCENARIOS).index(s))
            finally:
                proc.terminate()
                proc.wait()
            rows.append({"scenario": s, "knob": knob, "value": value, "traffic": "conversations, 3 turns"
                         if follow_up else "one-shot", **r})
            print(rows[-1], file=sys.stderr, flush=True)
    print("| scenario | knob | value | traffic | goodput (req/s) | output tokens/s | TTFT p50 (ms) | TTFT p99 (ms) | "
          "TPOT p50 (ms) | failed | best of knob |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        same = [x for x in rows if x["scenario"] == r["scenario"] and x["knob"] == r["knob"]]
        best = max(same, key=lambda x: merit(x["scenario"], x))
        good = "—" if r["goodput"] is None else f"{r['goodput']:.2f}"
        print(f"| {r['scenario']} | {r['knob']} | {r['value']} | {r['traffic']} | {good} | {r['throughput']:.1f} | "
              f"{r['ttft_p50']:.0f} | {r['ttft_p99']:.0f} | {r['tpot_p50']:.0f} | {r['failed']} | "
              f"{'**best**' if r is best else ''} |")
    for s in args.scenarios.split(","):
        if s not in CONVERSATIONS:
            print(f"\n{s}: one-shot requests; prefix caching and session TTL have nothing to reuse (not run).")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
