#!/usr/bin/env python3
"""Fleet benchmark (docs/disaggregation.md, BENCHMARKS.md): `inferd bench serve` against three
topologies on this machine with the same total threads (2):

  colocated   one `both` instance, -t 2, clients talk to it directly
  2xboth      two `both` instances, -t 1 each, behind `inferd router --policy cache-aware`
  1P+1D       one prefill and one decode instance, -t 1 each, behind the router (KV over UCX/TCP)

on two workloads: `mixed` (long summarisation prompts arriving among chat turns) and
`shared-prefix` (a few long system prompts, short questions). Prints TTFT / TPOT / ITL p50 and
p99, goodput at the SLO, KV transfer time per 1,000 prompt tokens against the prefill time per
1,000 tokens, and the router's own overhead per request (also as TTFT through the router in front
of one instance against direct).

  scripts/bench/fleet_bench.py [--num-prompts 40] [--rate 1.0] [--out DIR]
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

from serve_util import INFERD, free_port

SLO = "ttft=2s,tpot=100ms"
WORDS = ("river mill autumn heron village evening shallow bank stone bridge lantern harvest orchard "
         "market road winter letter window garden morning kitchen story farmer weather rain field").split()


def mixed_dataset(path, n, seed):
    """One in four requests a ~1,000-token document to summarise, the rest ~100-token chat turns."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            if i % 4 == 1:
                doc = " ".join(rng.choice(WORDS) for _ in range(950))
                f.write(json.dumps({"prompt": f"Summarise this report.\n{doc}\nSummary:", "max_tokens": 32}) + "\n")
            else:
                q = " ".join(rng.choice(WORDS) for _ in range(90))
                f.write(json.dumps({"prompt": f"Question {i}: {q}?\nAnswer:", "max_tokens": 32}) + "\n")


class Proc:
    def __init__(self, args, env=None, ready=r"ready:|routing"):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        full = [INFERD] + args[:1] + ["--host", "127.0.0.1", "--port", str(self.port)] + args[1:]
        self.p = subprocess.Popen(full, stderr=subprocess.DEVNULL, env=dict(os.environ, **(env or {})))
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(self.base + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception:
                time.sleep(0.2)
        raise RuntimeError("did not start: " + " ".join(full))

    def metrics(self):
        with urllib.request.urlopen(self.base + "/metrics", timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()


def post(base, body):
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def metric(m, pattern):
    return sum(v for k, v in m.items() if re.search(pattern, k))


SERVE = ["serve", "--kv-cache-memory", "512MiB", "--max-model-len", "4096"]


def topology(name):
    """Starts a topology; returns (the URL clients use, processes, prefill, decode, router)."""
    env = {"UCX_TLS": "tcp"}
    if name == "colocated":
        b = Proc(SERVE + ["-t", "2"])
        return b.base, [b], None, None, None
    if name == "router+colocated":
        b = Proc(SERVE + ["-t", "2"])
        r = Proc(["router", "--instance", b.base, "--health-interval", "0.5"])
        return r.base, [r, b], None, None, r
    if name.startswith("2xboth"):  # 2xboth (cache-aware), 2xboth:round-robin, 2xboth:least-load
        policy = name.split(":")[1] if ":" in name else "cache-aware"
        a, b = Proc(SERVE + ["-t", "1"]), Proc(SERVE + ["-t", "1"])
        r = Proc(["router", "--instance", a.base, "--instance", b.base, "--policy", policy,
                  "--health-interval", "0.5"])
        return r.base, [r, a, b], None, None, r
    if name == "1P+1D":
        p = Proc(SERVE + ["-t", "1", "--role", "prefill", "--kv-host", "127.0.0.1"], env=env)
        d = Proc(SERVE + ["-t", "1", "--role", "decode"], env=env)
        r = Proc(["router", "--prefill", p.base, "--decode", d.base, "--disagg-min-tokens", "256",
                  "--health-interval", "0.5"])
        return r.base, [r, p, d], p, d, r
    raise ValueError(name)


def bench(url, workload, args, out):
    cmd = [INFERD, "bench", "serve", "--base-url", url, "--num-prompts", str(args.num_prompts),
           "--request-rate", str(args.rate), "--seed", "1", "--slo", SLO, "--result-json", out, "--no-progress"]
    if workload == "mixed":
        cmd += ["--dataset", "jsonl:" + args.mixed]
    else:
        cmd += ["--dataset", "shared-prefix", "--prefix-len", "768", "--num-prefixes", "4", "--suffix-len", "48",
                "--output-len", "32"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-prompts", type=int, default=40)
    ap.add_argument("--rate", type=float, default=1.0)
    ap.add_argument("--out", default=tempfile.mkdtemp(prefix="fleet-bench-"))
    ap.add_argument("--topologies", default="colocated,2xboth,1P+1D")
    ap.add_argument("--workloads", default="mixed,shared-prefix")
    ap.add_argument("--no-extras", action="store_true", help="skip the overhead and transfer measurements")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    args.mixed = os.path.join(args.out, "mixed.jsonl")
    mixed_dataset(args.mixed, args.num_prompts, 7)
    rows, extra = [], []
    for workload in args.workloads.split(","):
        for topo in args.topologies.split(","):
            url, procs, p, d, r = topology(topo)
            try:
                res = bench(url, workload, args, os.path.join(args.out, f"{workload}-{topo}.json"))
                row = {"workload": workload, "topology": topo}
                for k in ("ttft", "tpot", "itl"):
                    row[k + "_p50"] = res.get(f"median_{k}_ms")
                    row[k + "_p99"] = res.get(f"p99_{k}_ms")
                row["goodput"] = res.get("request_goodput")
                row["out_tok_s"] = res.get("output_throughput")
                row["failed"] = res.get("failed", 0)
                if d is not None:
                    dm, pm = d.metrics(), p.metrics()
                    blocks = metric(dm, r'kv_transfer_blocks_total\{.*side="decode"')
                    secs = metric(dm, r'kv_transfer_seconds_total\{.*side="decode"')
                    pre_s = metric(pm, r"request_prefill_time_seconds_sum")
                    pre_tok = metric(pm, r"prompt_tokens_total")
                    row["transfer_ms_per_1k"] = 1e3 * secs / (blocks * 16 / 1000) if blocks else None
                    row["prefill_ms_per_1k"] = 1e3 * pre_s / (pre_tok / 1000) if pre_tok else None
                    row["pulls"] = metric(dm, r'kv_transfer_pulls_total\{.*side="decode"')
                    row["pull_failures"] = metric(dm, r"kv_load_failures_total")
                if r is not None:
                    rm = r.metrics()
                    n = metric(rm, r"inferd_router:overhead_seconds_count")
                    row["router_overhead_ms"] = 1e3 * metric(rm, r"inferd_router:overhead_seconds_sum") / n if n else None
                    row["disaggregated"] = metric(rm, r'disagg_decisions_total\{decision="disaggregated"')
                rows.append(row)
                print(json.dumps(row), flush=True)
            finally:
                for proc in procs:
                    proc.stop()
    # Router overhead as the client sees it: TTFT of short chat turns through a router in front of one
    # instance against the same instance directly, one request at a time.
    for topo in () if args.no_extras else ("colocated", "router+colocated"):
        url, procs, _, _, _ = topology(topo)
        try:
            cmd = [INFERD, "bench", "serve", "--base-url", url, "--num-prompts", "30", "--max-concurrency", "1",
                   "--request-rate", "inf", "--dataset", "random", "--input-len", "64", "--output-len", "8",
                   "--seed", "3", "--result-json", os.path.join(args.out, f"overhead-{topo}.json"), "--no-progress"]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            with open(os.path.join(args.out, f"overhead-{topo}.json")) as f:
                res = json.load(f)
            extra.append({"topology": topo, "ttft_p50": res["median_ttft_ms"], "e2el_p50": res["median_e2el_ms"]})
            print(json.dumps(extra[-1]), flush=True)
        finally:
            for proc in procs:
                proc.stop()
    # Transfer against recomputation, on idle instances: one ~1,000-token prompt through 1P+1D (the
    # decode instance pulls it), then the same prompt's twin (another first word: no prefix hit) to
    # the decode instance directly (it computes it), each with -t 1.
    url, procs, p, d, r = topology("1P+1D") if not args.no_extras else (None, [], None, None, None)
    try:
        rng = random.Random(5)
        if args.no_extras:
            raise StopIteration
        doc = " ".join(rng.choice(WORDS) for _ in range(950))
        for i in range(3):
            body = {"prompt": f"Report {i}.\n{doc}\nSummary:", "max_tokens": 2, "temperature": 0}
            post(url, body)
        dm, pm = d.metrics(), p.metrics()
        blocks = metric(dm, r'kv_transfer_blocks_total\{.*side="decode"')
        secs = metric(dm, r'kv_transfer_seconds_total\{.*side="decode"')
        pre_s = metric(pm, r"request_prefill_time_seconds_sum")
        pre_tok = metric(pm, r"prompt_tokens_total")
        before_s, before_tok = metric(dm, r"request_prefill_time_seconds_sum"), metric(dm, r"prompt_tokens_total")
        for i in range(3):
            post(d.base, {"prompt": f"Memo {i}.\n{doc}\nSummary:", "max_tokens": 2, "temperature": 0})
        dm2 = d.metrics()
        recompute = (metric(dm2, r"request_prefill_time_seconds_sum") - before_s) / (
            (metric(dm2, r"prompt_tokens_total") - before_tok) / 1000)
        extra.append({"idle_transfer_ms_per_1k": 1e3 * secs / (blocks * 16 / 1000),
                      "idle_prefill_instance_ms_per_1k": 1e3 * pre_s / (pre_tok / 1000),
                      "idle_decode_recompute_ms_per_1k": 1e3 * recompute,
                      "bytes_per_1k_tokens": metric(dm, r'kv_transfer_bytes_total\{.*side="decode"') / (blocks * 16 / 1000)})
        print(json.dumps(extra[-1]), flush=True)
    except StopIteration:
        pass
    finally:
        for proc in procs:
            proc.stop()
    with open(os.path.join(args.out, "fleet.json"), "w") as f:
        json.dump({"rows": rows, "overhead": extra}, f, indent=1)
    print("| workload | topology | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) | ITL p50 / p99 (ms) | goodput (req/s) | "
          "out tok/s | failed |")
    print("|---|---|---|---|---|---|---|---|")
    f = lambda x: "-" if x is None else f"{x:.0f}"
    for r in rows:
        print(f"| {r['workload']} | {r['topology']} | {f(r['ttft_p50'])} / {f(r['ttft_p99'])} | {f(r['tpot_p50'])} / "
              f"{f(r['tpot_p99'])} | {f(r['itl_p50'])} / {f(r['itl_p99'])} | {r['goodput']:.2f} | {r['out_tok_s']:.1f} | "
              f"{r['failed']} |")
    print("results in", args.out, file=sys.stderr)


if __name__ == "__main__":
    main()
