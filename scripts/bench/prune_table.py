#!/usr/bin/env python3
"""Structured pruning: perplexity against speed-up at several ratios (issue 21, part 4).

Layers: for N layers dropped, two choices of which: `inferd prune --drop-layers auto:N` (the N
layers of least Block Influence, measured on tests/fixtures/text/calibration.txt), and the N layers
just before the last one (a fixed choice to compare with). Heads and FFN channels:
`--prune-heads R` and `--prune-ffn R` at each ratio given, and the combinations in --mixed, all
calibrated on the same text. Each model is scored with `inferd perplexity` on
tests/fixtures/text/evaluation.txt (512-token chunks, second halves scored: a text kept apart from
the calibration text) and timed with `inferd bench latency` (pp512 and tg128, 2 threads).

  python3 scripts/bench/prune_table.py [--model M.gguf] [--drops 2,4,6,8] [--heads 0.33]
      [--ffn 0.25,0.5] [--mixed "auto:2/0/0.25,0/0.33/0.25"] [--reps 2]
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
    ap.add_argument("--heads", default="0.33", help="--prune-heads ratios (comma-separated, or empty)")
    ap.add_argument("--ffn", default="0.25,0.5", help="--prune-ffn ratios (comma-separated, or empty)")
    ap.add_argument("--mixed", default="auto:2/0/0.25,0/0.33/0.25",
                    help="combinations LAYERS/HEADS/FFN (0 = that cut off), comma-separated")
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    model = args.model or default_model()
    out = Path(tempfile.mkdtemp(prefix="inferd-prune-"))
    base_ppl, base = ppl(model), speed(model, args.reps)
    print(f"model: {model.name}; evaluation text {TEXT.name}, calibration text {CALIBRATION.name}")
    print("| cut | which | perplexity | x full | pp512 tokens/s | speed-up | tg128 tokens/s | speed-up |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| 0 | — | {base_ppl:.3f} | 1.000 | {base['pp']:.1f} | 1.00x | {base['tg']:.1f} | 1.00x |", flush=True)
    layers = None
    def row(cut, which, path):
        q, s = ppl(path), speed(path, args.reps)
        print(f"| {cut} | {which} | {q:.3f} | {q / base_ppl:.3f} | {s['pp']:.1f} | {s['pp'] / base['pp']:.2f}x | "
              f"{s['tg']:.1f} | {s['tg'] / base['tg']:.2f}x |", flush=True)

    table = ""
    for n in [int(x) for x in args.drops.split(",") if x]:
        auto = out / f"auto{n}.gguf"
        p = subprocess.run([str(INFERD), "prune", "-i", str(model), "-o", str(auto), "--drop-layers", f"auto:{n}",
                            "--calibration", str(CALIBRATION)], check=True, capture_output=True, text=True)
        chosen = re.search(r"dropping layers ([\d,]+)", p.stderr).group(1)
        table = re.search(r"Block Influence per layer: (.*)", p.stderr).group(1)
        layers = layers or len(re.findall(r" ?\d+:[\d.]+", table))
        last = out / f"last{n}.gguf"
        fixed = f"{layers - 1 - n}-{layers - 2}"
        subprocess.run([str(INFERD), "prune", "-i", str(model), "-o", str(last), "--drop-layers", fixed],
                       check=True, capture_output=True)
        for which, path in ((f"auto: {chosen}", auto), (f"before the last: {fixed}", last)):
            row(f"{n} layers", which, path)

    def cut(name, flags):
        path = out / f"{name}.gguf"
        p = subprocess.run([str(INFERD), "prune", "-i", str(model), "-o", str(path), *flags,
                            "--calibration", str(CALIBRATION)], check=True, capture_output=True, text=True)
        shape = re.search(r"layers (\d+ -> \d+), query / KV heads (.*?), FFN channels (\d+ -> \d+)", p.stderr)
        return path, f"layers {shape.group(1)}, heads {shape.group(2)}, FFN {shape.group(3)}"

    for r in [x for x in args.heads.split(",") if x]:
        row(f"heads {r}", *reversed(cut(f"heads{r}", ["--prune-heads", r])))
    for r in [x for x in args.ffn.split(",") if x]:
        row(f"FFN {r}", *reversed(cut(f"ffn{r}", ["--prune-ffn", r])))
    for combo in [x for x in args.mixed.split(",") if x]:
        layers_cut, heads, ffn = combo.split("/")
        flags = (["--drop-layers", layers_cut] if layers_cut != "0" else []) + \
                (["--prune-heads", heads] if heads != "0" else []) + (["--prune-ffn", ffn] if ffn != "0" else [])
        row(f"mixed {combo}", *reversed(cut(f"mixed{combo.replace('/', '_').replace(':', '')}", flags)))
    if table:
        print("Block Influence per layer:", table)


if __name__ == "__main__":
    main()
