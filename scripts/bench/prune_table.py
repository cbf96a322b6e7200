#!/usr/bin/env python3
"""Layer pruning: perplexity against speed-up at several depths (issue 21, part 4).

For N layers dropped, two choices of which: `inferd prune --drop-layers auto:N` (the N layers of
least Block Influence, measured on tests/fixtures/text/calibration.txt), and the N layers just
before the last one (a fixed choice to compare with). Each model is scored with `inferd perplexity`
on tests/fixtures/text/evaluation.txt (512-token chunks, second halves scored: a text kept apart
from the calibration text) and timed with `inferd bench latency` (pp512 and tg128, 2 threads).

  python3 scripts/bench/prune_table.py [--model M.gguf] [--drops 2,4,6,8] [--reps 2]
"""
import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from perplexity_table import INFERD, ROOT, TEXT, default_model  # noqa: E402

CALIBRATION = ROOT / "tests" / "fixtures" / "text" / "calibration.txt"


def ppl(model):
    p = subprocess.run([str(INFERD), "perplexity", "-m", str(model), "-f", str(TEXT), "-c", "512", "-t", "2",
                        "--json"], check=True, capture_output=True, text=True)
    return json.loads(p.stdout)["perplexity"]


def speed(model, reps):
    out = {}
    for what, args in (("pp", ["-p", "512", "-n", "0"]), ("tg", ["-p", "0", "-n", "128"])):
        p = subprocess.run([str(INFERD), "bench", "latency", "-m", str(model), "-t", "2", *args, "-r", str(reps),
                            "--json"], check=True, capture_output=True, text=True)
        j = json.loads(p.stdout.strip().splitlines()[-1])
        out[what] = j["prompt_tokens_per_second"] if what == "pp" else j["generation_tokens_per_second"]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path)
    ap.add_argument("--drops", default="2,4,6,8")
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    model = args.model or default_model()
    out = Path(tempfile.mkdtemp(prefix="inferd-prune-"))
    base_ppl, base = ppl(model), speed(model, args.reps)
    print(f"model: {model.name}; evaluation text {TEXT.name}, calibration text {CALIBRATION.name}")
    print("| layers dropped | which | perplexity | x full | pp512 tokens/s | speed-up | tg128 tokens/s | speed-up |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| 0 | — | {base_ppl:.3f} | 1.000 | {base['pp']:.1f} | 1.00x | {base['tg']:.1f} | 1.00x |", flush=True)
    layers = None
    for n in [int(x) for x in args.drops.split(",")]:
        auto = out / f"auto{n}.gguf"
        p = subprocess.run([str(INFERD), "prune", "-i", str(model), "-o", str(auto), "--drop-layers", f"auto:{n}",
                            "--calibration", str(CALIBRATION)], check=True, capture_output=True, text=True)
        chosen = re.search(r"dropping layers ([\d,]+)", p.stderr).group(1)
        layers = layers or len(re.findall(r" ?\d+:[\d.]+", re.search(r"tokens: (.*)", p.stderr).group(1)))
        last = out / f"last{n}.gguf"
        fixed = f"{layers - 1 - n}-{layers - 2}"
        subprocess.run([str(INFERD), "prune", "-i", str(model), "-o", str(last), "--drop-layers", fixed],
                       check=True, capture_output=True)
        for which, path in ((f"auto: {chosen}", auto), (f"before the last: {fixed}", last)):
            q, s = ppl(path), speed(path, args.reps)
            print(f"| {n} | {which} | {q:.3f} | {q / base_ppl:.3f} | {s['pp']:.1f} | {s['pp'] / base['pp']:.2f}x | "
                  f"{s['tg']:.1f} | {s['tg'] / base['tg']:.2f}x |", flush=True)
    print("Block Influence per layer:", p.stderr.split("tokens: ")[1].splitlines()[0])


if __name__ == "__main__":
    main()
