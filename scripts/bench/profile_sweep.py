#!/usr/bin/env python3
"""The sweep behind `inferd serve --profile` (issue 21, part 3): for each scenario, `inferd bench
serve` against `inferd serve` on the default model over a grid of scheduling parameters
(--schedule-policy x --max-num-batched-tokens, the token budget that is also the prefill chunk),
and the configuration with the best figure of merit per scenario. Latency scenarios: goodput
(requests/s within the scenario's SLO) at the scenario's concurrency, TTFT p99 breaking ties;
batch: output tokens/s with every request at once. Writes the table (markdown) and, with
--json, every run's figures; --plot DIR draws one PNG per scenario (gnuplot).

  python3 scripts/bench/profile_sweep.py [--json sweep.json] [--plot DIR]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import INFERD, start_server  # noqa: E402

# name: (input tokens, output tokens, concurrency (0: all at once), prompts, SLO)
SCENARIOS = {
    "chat": (512, 64, 8, 16, "ttft=1.5s,tpot=150ms"),
    "code": (1024, 128, 4, 8, "ttft=2s,tpot=150ms"),
    "summarize": (2048, 128, 4, 8, "ttft=5s,tpot=200ms"),
    "long-context": (6000, 64, 2, 4, "ttft=10s,tpot=300ms"),
    "batch": (1024, 128, 0, 24, ""),
}
POLICIES = ["decode-first", "prefill-first", "adaptive"]
BUDGETS = [512, 2048, 8192]


def run(port, scenario, tmp, seed=3, dataset=None, extra=()):
    """One `inferd bench serve` of the scenario: random prompts (or `dataset`: the --dataset and
    --num-prompts flags to use instead), plus `extra` flags."""
    inp, out, conc, n, slo = SCENARIOS[scenario]
    dataset = dataset or ["--dataset", "random", "--num-prompts", str(n)]
    cmd = [INFERD, "bench", "serve", "--base-url", f"http://127.0.0.1:{port}", *dataset, *extra,
           "--input-len", str(inp), "--output-len", str(out), "--range-ratio", "0.3",
           "--request-rate", "inf", "--seed", str(seed), "--result-json", os.path.join(tmp, "r.json"), "--no-progress"]
    if conc:
        cmd += ["--max-concurrency", str(conc)]
    if slo:
        cmd += ["--slo", slo]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return figures(os.path.join(tmp, "r.json"))


def figures(result_json):
    """The figures the sweeps compare, from `inferd bench serve --result-json`."""
    with open(result_json) as f:
        r = json.load(f)
    return {"goodput": r["request_goodput"], "throughput": r["output_throughput"],
            "ttft_p50": r["median_ttft_ms"], "ttft_p99": r["p99_ttft_ms"], "tpot_p50": r["median_tpot_ms"],
            "failed": r["failed"], "completed": r["completed"]}


def merit(scenario, r):
    return (r["throughput"],) if scenario == "batch" else (r["goodput"], -r["ttft_p99"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--plot")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = ap.parse_args()
    scenarios = args.scenarios.split(",")
    tmp = tempfile.mkdtemp()
    results = {}
    for policy in POLICIES:
        for budget in BUDGETS:
            flags = ["--schedule-policy", policy, "--max-num-batched-tokens", str(budget), "--max-prefill-tokens",
                     str(budget), "--max-model-len", "8192"]
            proc, port = start_server(*flags)
            try:
                run(port, "chat", tmp, seed=99)  # warm-up (other prompts: no prefix-cache hits), not reported
                for s in scenarios:  # a seed per scenario: no prompt shares a prefix with another's
                    results[(s, policy, budget)] = run(port, s, tmp, seed=3 + list(SCENARIOS).index(s))
                    print(s, policy, budget, results[(s, policy, budget)], file=sys.stderr, flush=True)
            finally:
                proc.terminate()
                proc.wait()
    print("| scenario | policy | budget | goodput (req/s) | output tokens/s | TTFT p50 (ms) | TTFT p99 (ms) | "
          "TPOT p50 (ms) | failed | best |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for s in scenarios:
        best = max(((p, b) for p in POLICIES for b in BUDGETS), key=lambda k: merit(s, results[(s, *k)]))
        for p in POLICIES:
            for b in BUDGETS:
                r = results[(s, p, b)]
                good = "—" if r["goodput"] is None else f"{r['goodput']:.2f}"
                print(f"| {s} | {p} | {b} | {good} | {r['throughput']:.1f} | {r['ttft_p50']:.0f} | "
                      f"{r['ttft_p99']:.0f} | {r['tpot_p50']:.0f} | {r['failed']} | {'**best**' if (p, b) == best else ''} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"scenario": s, "policy": p, "budget": b, **r} for (s, p, b), r in results.items()], f, indent=1)
    if args.plot:
        os.makedirs(args.plot, exist_ok=True)
        for s in scenarios:
            data = os.path.join(tmp, f"{s}.dat")
            with open(data, "w") as f:
                for i, p in enumerate(POLICIES):
                    for j, b in enumerate(BUDGETS):
                        r = results[(s, p, b)]
                        y = r["throughput"] if s == "batch" else r["goodput"]
                        f.write(f"{i * (len(BUDGETS) + 1) + j} \"{p}\\n{b}\" {y}\n")
            ylabel = "output tokens/s" if s == "batch" else "goodput (requests/s within the SLO)"
            script = (f"set terminal png size 900,400; set output '{os.path.join(args.plot, s + '.png')}';"
                      f"set title 'profile sweep: {s}'; set ylabel '{ylabel}'; set style fill solid 0.6;"
                      f"set boxwidth 0.8; set yrange [0:*]; set xtics rotate by -30;"
                      f"plot '{data}' using 1:3:xtic(2) with boxes notitle")
            subprocess.run(["gnuplot", "-e", script], check=True)


if __name__ == "__main__":
    main()
