#!/usr/bin/env python3
"""SLO classes against none, on a mixed workload beyond capacity (issue 21, part 2).

Interactive chat (short prompts, short answers) and batch summarisation (long prompts) arrive
as two Poisson streams at once, more than the server computes, for --duration seconds. The same
arrival times run against `inferd serve` twice: with `--slo-class chat:... --slo-class batch:...`
(each request names its class in the X-SLO-Class header) and without classes. Every request is
streamed; its time to first token (TTFT) and time per output token (TPOT) are measured here, and
a request is goodput when it finished within its class's TTFT and TPOT (DistServe's definition),
judged the same way in both runs. Prints, per run and class: sent, finished, refused (429), lost
(no answer: must be 0), goodput (requests/s within the SLO), TTFT p50 / p99 of the finished.

  python3 scripts/bench/slo_mixed.py [--duration 60] [--chat-rate 2] [--batch-rate 0.8]
"""
import argparse
import http.client
import json
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import ROOT, start_server  # noqa: E402

TEXT = open(os.path.join(ROOT, "tests", "fixtures", "text", "evaluation.txt")).read()


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def one_request(port, body, headers, out):
    t0 = time.perf_counter()
    rec = {"status": None, "ttft": None, "tpot": None, "tokens": 0}
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
        conn.request("POST", "/v1/completions", body=json.dumps(body),
                     headers={"Content-Type": "application/json", **headers})
        r = conn.getresponse()
        rec["status"] = r.status
        if r.status != 200:
            r.read()
            out.append(rec)
            return
        first = last = None
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                rec["tokens"] = ev["usage"]["completion_tokens"]
            if ev.get("choices") and ev["choices"][0].get("text"):
                now = time.perf_counter()
                first = first or now
                last = now
        conn.close()
        if first is not None:
            rec["ttft"] = first - t0
            if rec["tokens"] > 1:
                rec["tpot"] = (last - first) / (rec["tokens"] - 1)
        else:
            rec["status"] = "empty"
    except Exception as e:  # a lost request: counted, never hidden
        rec["status"] = "lost: " + type(e).__name__
    out.append(rec)


def run(port, arrivals, use_classes):
    results = {"chat": [], "batch": []}
    threads = []
    start = time.perf_counter()
    for at, kind, body in arrivals:
        delay = at - (time.perf_counter() - start)
        if delay > 0:
            time.sleep(delay)
        headers = {"X-SLO-Class": kind} if use_classes else {}
        t = threading.Thread(target=one_request, args=(port, body, headers, results[kind]))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    return results, time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=60)
    ap.add_argument("--chat-rate", type=float, default=2.0)
    ap.add_argument("--batch-rate", type=float, default=0.8)
    ap.add_argument("--chat-ttft", type=float, default=1.0)
    ap.add_argument("--chat-tpot", type=float, default=0.1)
    ap.add_argument("--batch-ttft", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--runs", default="off,on")
    ap.add_argument("--server-log", help="append the servers' logs (one line per request) to this file")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    arrivals = []
    for kind, rate in (("chat", args.chat_rate), ("batch", args.batch_rate)):
        t = rng.expovariate(rate)
        while t < args.duration:
            if kind == "chat":
                off = rng.randrange(0, len(TEXT) - 400)
                body = {"prompt": "Answer briefly: " + TEXT[off:off + 250], "max_tokens": 32}
            else:
                off = rng.randrange(0, len(TEXT) - 7000)
                body = {"prompt": "Summarise this text:\n" + TEXT[off:off + 6000] + "\nSummary:", "max_tokens": 64}
            body.update({"temperature": 0, "ignore_eos": True, "stream": True,
                         "stream_options": {"include_usage": True}})
            arrivals.append((t, kind, body))
            t += rng.expovariate(rate)
    arrivals.sort(key=lambda a: a[0])
    slo = {"chat": (args.chat_ttft, args.chat_tpot), "batch": (args.batch_ttft, float("inf"))}
    flags = ["--slo-class", f"chat:ttft={args.chat_ttft}s,tpot={args.chat_tpot}s,weight=4",
             "--slo-class", f"batch:ttft={args.batch_ttft}s,weight=1"]
    print(f"workload: {sum(1 for a in arrivals if a[1] == 'chat')} chat (~70-token prompts, 32 tokens out) at "
          f"{args.chat_rate}/s and {sum(1 for a in arrivals if a[1] == 'batch')} batch (~1500-token prompts, 64 out) "
          f"at {args.batch_rate}/s over {args.duration:.0f} s; SLOs: chat TTFT {args.chat_ttft} s TPOT "
          f"{args.chat_tpot} s, batch TTFT {args.batch_ttft} s")
    print("| classes | class | sent | finished | refused (429) | lost | within SLO | goodput (req/s) | "
          "TTFT p50 (s) | TTFT p99 (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for mode in args.runs.split(","):
        log = open(args.server_log, "a") if args.server_log else None
        proc, port = start_server(*(flags if mode == "on" else []), log=log)
        try:
            results, _ = run(port, arrivals, mode == "on")
        finally:
            proc.terminate()
            proc.wait()
        for kind in ("chat", "batch"):
            recs = results[kind]
            ok = [r for r in recs if r["status"] == 200 and r["ttft"] is not None]
            refused = sum(1 for r in recs if r["status"] == 429)
            lost = len(recs) - len(ok) - refused
            ttft_max, tpot_max = slo[kind]
            met = sum(1 for r in ok if r["ttft"] <= ttft_max and (r["tpot"] or 0) <= tpot_max)
            ttfts = [r["ttft"] for r in ok]
            print(f"| {mode} | {kind} | {len(recs)} | {len(ok)} | {refused} | {lost} | {met} | "
                  f"{met / args.duration:.2f} | {percentile(ttfts, 50):.2f} | {percentile(ttfts, 99):.2f} |")
            if lost:
                print("  lost:", sorted({str(r['status']) for r in recs if r['status'] not in (200, 429)}))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
