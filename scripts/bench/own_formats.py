#!/usr/bin/env python3
"""inferd's own weight formats (INT8 W8A8, FP8 E4M3, INT4 g128) against GGUF's, in one run.

    python3 scripts/bench/own_formats.py [--reps 3] [--threads 2]

Quantizes the Qwen2.5-0.5B-shaped F16 model of scripts/peer/make_models.py with `inferd quantize
--type int8|fp8|int4 --pure` (kept in the peer's model folder; --pure keeps INT4's embedding
in INT4, as the peer's Q4_0 file has it), then measures pp512 and tg128 with
`inferd bench latency` for those and for the GGUF Q8_0 / Q4_0 / F16 files, and llama-bench on the
GGUF files (llama.cpp reads no inferd format): each inferd format is set against llama.cpp's
nearest (INT8 - Q8_0, INT4 - Q4_0, FP8 - Q8_0, the other 8-bit file). The BF16 file (from the F16
one) runs on both the packed float kernel and `--matmul onednn`, against llama.cpp's BF16.
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import peer_build  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
INFERD = ROOT / "build" / "inferd"
PEER = Path(os.environ.get("INFERD_PEER_DIR", Path.home() / ".cache" / "inferd-peer"))
MODELS = PEER / "models"
NEAREST = {"int8": "q8_0", "fp8": "q8_0", "int4": "q4_0", "q8_0": "q8_0", "q4_0": "q4_0", "f16": "f16",
           "bf16": "bf16"}


def model(fmt):
    return MODELS / f"qwen2.5-0.5b-shapes-{fmt}.gguf"


def ours(path, args, matmul="packed"):
    p = subprocess.run([str(INFERD), "bench", "latency", "-m", str(path), "-t", str(args.threads), "-p", "512",
                        "-n", "128", "-r", str(args.reps), "--matmul", matmul, "--json"], check=True,
                       capture_output=True, text=True)
    r = json.loads(p.stdout)
    return r["prompt_tokens_per_second"], r["generation_tokens_per_second"]


def peer(path, args):
    p = subprocess.run([str(PEER / "bin" / "llama-bench"), "-m", str(path), "-t", str(args.threads), "-p", "512",
                        "-n", "128", "-r", str(args.reps), "-o", "json"], check=True, capture_output=True, text=True)
    r = {("pp" if x["n_prompt"] > 0 else "tg"): x["avg_ts"] for x in json.loads(p.stdout)}
    return r["pp"], r["tg"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if not model("bf16").exists():
        subprocess.run([str(INFERD), "quantize", "-i", str(model("f16")), "-o", str(model("bf16")), "--type",
                        "bf16"], check=True, capture_output=True)
    for fmt in ("int8", "fp8", "int4"):
        if not model(fmt).exists():
            # --pure: the embedding / LM head in the format too, as in the peer's Q4_0 file.
            subprocess.run([str(INFERD), "quantize", "-i", str(model("f16")), "-o", str(model(fmt)), "--type", fmt,
                            "--pure"], check=True, capture_output=True)
    theirs = {fmt: peer(model(fmt), args) for fmt in ("q8_0", "q4_0", "f16", "bf16")}
    print(f"peer: {peer_build()}")
    print("| inferd format | file MB | inferd pp512 | inferd tg128 | llama.cpp format | llama.cpp pp512 | "
          "llama.cpp tg128 | pp ratio | tg ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    runs = [(f, "packed") for f in ("int8", "fp8", "int4", "q8_0", "q4_0", "f16", "bf16")] + [("bf16", "onednn")]
    for fmt, matmul in runs:
        pp, tg = ours(model(fmt), args, matmul)
        near = NEAREST[fmt]
        ppp, ptg = theirs[near]
        label = fmt if matmul == "packed" else f"{fmt}, --matmul {matmul}"
        print(f"| {label} | {model(fmt).stat().st_size / 1e6:.0f} | {pp:.1f} | {tg:.1f} | {near.upper()} | "
              f"{ppp:.1f} | {ptg:.1f} | {pp / ppp:.2f}x | {tg / ptg:.2f}x |")


if __name__ == "__main__":
    main()
