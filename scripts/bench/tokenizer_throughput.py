#!/usr/bin/env python3
"""Encode throughput of inferd's tokenizer vs Hugging Face `tokenizers`, single thread, same run.

    python3 scripts/bench/tokenizer_throughput.py [--mb 10]

The committed corpus (tests/fixtures/tokenizer/smollm2_cases.json, valid strings) is repeated to
at least --mb megabytes; each string is one document. `tokenizers` gets SmolLM2's pipeline
rebuilt from the GGUF (as in scripts/fixtures/make_tokenizer_cases.py) and encodes document by
document (per-call Python overhead included) and with encode_batch (none), with
RAYON_NUM_THREADS=1; inferd runs `inferd tokenize --jsonl`. Both counts of tokens
must agree.
"""
# Runs under the checkout's virtual environment (.venv, made by scripts/setup: the PyPI packages).
import os, pathlib, sys  # noqa: E401,E402
_venv = pathlib.Path(__file__).resolve().parents[2] / ".venv"
if (_venv / "bin/python").exists() and pathlib.Path(sys.prefix).resolve() != _venv.resolve():
    os.execv(str(_venv / "bin/python"), [str(_venv / "bin/python"), *sys.argv])
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "fixtures"))
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

from make_tokenizer_cases import smollm2_tokenizer  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--doc-bytes", type=int, default=0, help="join strings into documents of about this size")
    a = ap.parse_args()
    cases = json.loads((ROOT / "tests/fixtures/tokenizer/smollm2_cases.json").read_text())["cases"]
    base = [c["text"] for c in cases if "text" in c and c["text"]]
    docs, size, current = [], 0, []
    while size < a.mb * 1e6:
        for t in base:
            current.append(t)
            size += len(t.encode())
            if sum(len(x) for x in current) >= a.doc_bytes:
                docs.append("\n".join(current))
                current = []
    if current:
        docs.append("\n".join(current))
    size = sum(len(d.encode()) for d in docs)
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for d in docs:
            f.write(json.dumps(d) + "\n")
        path = f.name
    tok = smollm2_tokenizer()
    hf, hf_batch, ours = [], [], []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        n_hf = sum(len(tok.encode(d, add_special_tokens=False).ids) for d in docs)
        hf.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        n_batch = sum(len(e.ids) for e in tok.encode_batch(docs, add_special_tokens=False))
        hf_batch.append(time.perf_counter() - t0)
        assert n_batch == n_hf
        out = subprocess.run([str(ROOT / "build/inferd"), "tokenize", "--jsonl", path, "--allow-special"],
                             capture_output=True, text=True, check=True)
        r = json.loads(out.stdout)
        ours.append(r["seconds"])
        assert r["tokens"] == n_hf, (r["tokens"], n_hf)
    os.unlink(path)
    hf_s, batch_s, our_s = min(hf), min(hf_batch), min(ours)
    print(f"{len(docs)} documents, {size / 1e6:.1f} MB, {n_hf} tokens; best of {a.repeats}")
    print("| tokenizer | MB/s | tokens/s |")
    print("|---|---|---|")
    print(f"| inferd | {size / 1e6 / our_s:.2f} | {n_hf / our_s:,.0f} |")
    print(f"| HF tokenizers (encode, 1 thread) | {size / 1e6 / hf_s:.2f} | {n_hf / hf_s:,.0f} |")
    print(f"| HF tokenizers (encode_batch, RAYON_NUM_THREADS=1) | {size / 1e6 / batch_s:.2f} | {n_hf / batch_s:,.0f} |")
    print(f"ratio inferd / tokenizers: {hf_s / our_s:.2f} (per-call encode), {batch_s / our_s:.2f} (encode_batch)")


if __name__ == "__main__":
    main()
