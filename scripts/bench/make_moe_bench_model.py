#!/usr/bin/env python3
"""A random-weight Qwen3-MoE GGUF for the MoE decode benchmark (BENCHMARKS.md), written outside
the repository with the `gguf` package:

    python3 scripts/bench/make_moe_bench_model.py [--out DIR] [--types q8_0,q4_0]

Qwen3-30B-A3B's proportions scaled to a 2-core / 24 GiB machine: 128 experts, top-8, normalized
top-k weights; hidden 2048 -> 1024, moe_intermediate 768 -> 384, 32 query / 4 KV heads of 128 ->
16 / 2 of 128 (q_dim twice hidden, as there), 48 layers -> 8, vocabulary 151,936 -> 16,384 (so the
output matrix is about the same ~11 % of the weights a token reads). Per token that is 8 experts
x 3 x 384 x 1024 x 8 layers = 75 M expert weights out of 1.2 G stored. Tensor names and layout as
llama.cpp's converter writes qwen3moe (blk.N.ffn_{gate,up,down}_exps [128, rows, cols]; the router
blk.N.ffn_gate_inp in F32); every other 2-D weight in the named type, norms F32. A placeholder
byte-level vocabulary (no merges that matter) satisfies llama.cpp's loader; neither benchmark
tokenizes. Writes DIR/qwen3moe-a3b-shapes-<type>.gguf; DIR defaults to $INFERD_PEER_DIR/models.
Existing files are kept.
"""
# Runs under the checkout's virtual environment (.venv, made by scripts/setup: the PyPI packages).
import os, pathlib, sys  # noqa: E401,E402
_venv = pathlib.Path(__file__).resolve().parents[2] / ".venv"
if (_venv / "bin/python").exists() and pathlib.Path(sys.prefix).resolve() != _venv.resolve():
    os.execv(str(_venv / "bin/python"), [str(_venv / "bin/python"), *sys.argv])
import argparse  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import gguf  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402

SHAPE = dict(vocab=16384, hidden=1024, layers=8, heads=16, kv_heads=2, head_dim=128, ffn=3072, experts=128,
             experts_used=8, moe_ffn=384, ctx=4096, theta=1000000.0, eps=1e-6)
TYPES = {"q8_0": QT.Q8_0, "q4_0": QT.Q4_0, "f16": QT.F16}
FILE_TYPES = {"q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
              "f16": gguf.LlamaFileType.MOSTLY_F16}


def random_blocks(rng, qtype, shape):
    """Random quantized bytes of a tensor `shape` (last axis the row): each block a small f16 scale
    and uniformly random quants, without drawing and rounding floats (1.2 G values stay quick)."""
    *outer, cols = shape
    if qtype == QT.F16:
        return rng.normal(0, 0.02, size=shape).astype(np.float16)
    block_values, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    nblocks = int(np.prod(outer)) * (cols // block_values)
    raw = rng.integers(0, 256, size=(nblocks, block_bytes), dtype=np.uint8)
    scale = np.full(nblocks, 0.02 / 64 if qtype == QT.Q8_0 else 0.02 / 4, dtype=np.float16)
    raw[:, :2] = scale.view(np.uint8).reshape(nblocks, 2)
    return raw.reshape(*outer, (cols // block_values) * block_bytes)


def write(path: Path, type_name: str):
    s = SHAPE
    qtype = TYPES[type_name]
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_name(f"Qwen3-30B-A3B proportions, scaled, random weights ({type_name})")
    w.add_block_count(s["layers"])
    w.add_context_length(s["ctx"])
    w.add_embedding_length(s["hidden"])
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_rope_freq_base(s["theta"])
    w.add_layer_norm_rms_eps(s["eps"])
    w.add_expert_count(s["experts"])
    w.add_expert_used_count(s["experts_used"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_expert_feed_forward_length(s["moe_ffn"])
    w.add_file_type(FILE_TYPES[type_name])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list([f"<{i}>" for i in range(s["vocab"])])
    w.add_token_types([gguf.TokenType.NORMAL] * s["vocab"])
    w.add_token_merges(["< 1"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_add_bos_token(False)

    def matrix(name, *shape):
        data = random_blocks(rng, qtype, shape)
        if qtype == QT.F16:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_dtype=qtype)

    def f32(name, *shape, value=None):
        data = np.full(shape, value, np.float32) if value is not None else rng.normal(0, 0.02, shape).astype(np.float32)
        w.add_tensor(name, data)

    h, hd = s["hidden"], s["head_dim"]
    q, kv, e, f = s["heads"] * hd, s["kv_heads"] * hd, s["experts"], s["moe_ffn"]
    matrix("token_embd.weight", s["vocab"], h)
    for i in range(s["layers"]):
        p = f"blk.{i}."
        f32(p + "attn_norm.weight", h, value=1.0)
        matrix(p + "attn_q.weight", q, h)
        matrix(p + "attn_k.weight", kv, h)
        matrix(p + "attn_v.weight", kv, h)
        matrix(p + "attn_output.weight", h, q)
        f32(p + "attn_q_norm.weight", hd, value=1.0)
        f32(p + "attn_k_norm.weight", hd, value=1.0)
        f32(p + "ffn_norm.weight", h, value=1.0)
        f32(p + "ffn_gate_inp.weight", e, h)  # the router: F32, as the converter keeps it
        matrix(p + "ffn_gate_exps.weight", e, f, h)
        matrix(p + "ffn_up_exps.weight", e, f, h)
        matrix(p + "ffn_down_exps.weight", e, h, f)
    f32("output_norm.weight", h, value=1.0)
    matrix("output.weight", s["vocab"], h)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser()
    peer = Path(os.environ.get("INFERD_PEER_DIR", Path.home() / ".cache" / "inferd-peer"))
    ap.add_argument("--out", type=Path, default=peer / "models")
    ap.add_argument("--types", default="q8_0,q4_0")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for t in args.types.split(","):
        path = args.out / f"qwen3moe-a3b-shapes-{t}.gguf"
        if path.exists():
            print(f"make_moe_bench_model: keeping {path}")
            continue
        print(f"make_moe_bench_model: writing {path}", flush=True)
        write(path.with_suffix(".tmp"), t)
        path.with_suffix(".tmp").rename(path)
        print(f"make_moe_bench_model: {path} {path.stat().st_size / 2**30:.2f} GiB")


if __name__ == "__main__":
    main()
