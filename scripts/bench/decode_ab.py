#!/usr/bin/env python3
"""Single-sequence decode of inferd, another inferd binary and llama.cpp, interleaved round by round.

    python3 scripts/bench/decode_ab.py [--baseline BINARY] [--rounds 5] [--tokens 64] [--depth D] MODEL.gguf ...

Each round runs `inferd bench latency -p 0 -n N -r 1` of build/inferd (and of --baseline, an
older build), then `llama-bench -p 0 -n N -r 1` of the peer (scripts/peer/build_llama_cpp.sh),
on each model; the medians over the rounds are printed as a Markdown table with the ratios. With
--depth D every run decodes after D tokens already in the KV cache (`-d D` of both tools), and the
peer runs with flash attention off and on, the better of the two counting for the round. On a
shared, noisy machine three repetitions of one binary in a row share the load of that minute;
interleaving spreads it over all of them. A MODEL without a slash is looked up in the peer's
models directory (scripts/peer/make_models.py).
"""
import argparse
import json
import os
import statistics
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEER = Path(os.environ.get("INFERD_PEER_DIR", Path.home() / ".cache" / "inferd-peer"))


def inferd_tg(binary, model, tokens, threads, depth):
    p = subprocess.run([str(binary), "bench", "latency", "-m", str(model), "-t", str(threads), "-p", "0", "-n",
                        str(tokens), "-d", str(depth), "-r", "1", "--json"], check=True, capture_output=True, text=True)
    return json.loads(p.stdout)["generation_tokens_per_second"]


def peer_tg(model, tokens, threads, depth):
    best = 0.0
    for fa in (["0", "1"] if depth > 0 else [None]):
        cmd = [str(PEER / "bin" / "llama-bench"), "-m", str(model), "-p", "0", "-n", str(tokens), "-r", "1",
               "-t", str(threads), "-o", "json"]
        if fa is not None:
            cmd += ["-d", str(depth), "-fa", fa]
        p = subprocess.run(cmd, check=True, capture_output=True, text=True)
        best = max(best, json.loads(p.stdout)[0]["avg_ts"])
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--baseline", type=Path, help="an older inferd binary measured in the same rounds")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--depth", type=int, default=0, help="tokens in the KV cache before the decoded ones")
    args = ap.parse_args()
    cols = ["inferd"] + (["baseline"] if args.baseline else []) + ["llama.cpp"]
    print(f"| model | {' | '.join(cols)} | inferd / llama.cpp |" + (" inferd / baseline |" if args.baseline else ""))
    print("|---" * (len(cols) + 2 + (1 if args.baseline else 0)) + "|")
    for name in args.models:
        model = Path(name) if "/" in name else PEER / "models" / name
        runs = {c: [] for c in cols}
        for _ in range(args.rounds):
            runs["inferd"].append(inferd_tg(ROOT / "build" / "inferd", model, args.tokens, args.threads, args.depth))
            if args.baseline:
                runs["baseline"].append(inferd_tg(args.baseline, model, args.tokens, args.threads, args.depth))
            runs["llama.cpp"].append(peer_tg(model, args.tokens, args.threads, args.depth))
        med = {c: statistics.median(v) for c, v in runs.items()}
        row = f"| {model.name} | " + " | ".join(f"{med[c]:.1f}" for c in cols)
        row += f" | {med['inferd'] / med['llama.cpp']:.2f}x |"
        if args.baseline:
            row += f" {med['inferd'] / med['baseline']:.2f}x |"
        print(row, flush=True)
        print("  runs: " + "; ".join(f"{c} " + ", ".join(f"{x:.1f}" for x in v) for c, v in runs.items()), flush=True)


if __name__ == "__main__":
    main()
