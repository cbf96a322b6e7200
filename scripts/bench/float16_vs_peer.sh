#!/usr/bin/env bash
# 16-bit weights against llama.cpp (issue 20, part 3): the Qwen2.5-0.5B-shaped BF16 and F16 files
# (scripts/peer/make_models.py --types f16, then `inferd quantize --type bf16`), three interleaved
# rounds of `inferd bench latency` and `llama-bench`, pp512 / tg128, 2 threads; one table row per
# round and format. Run from the repository root after building.
set -euo pipefail
M=${INFERD_PEER_DIR:-$HOME/.cache/inferd-peer}/models
PEER=${INFERD_PEER_DIR:-$HOME/.cache/inferd-peer}/bin/llama-bench
[ -f "$M/qwen2.5-0.5b-shapes-f16.gguf" ] || .venv/bin/python scripts/peer/make_models.py --types f16
[ -f "$M/qwen2.5-0.5b-shapes-bf16.gguf" ] ||
  build/inferd quantize -i "$M/qwen2.5-0.5b-shapes-f16.gguf" -o "$M/qwen2.5-0.5b-shapes-bf16.gguf" --type bf16
echo "| round | weights | inferd pp512 | inferd tg128 | llama.cpp pp512 | llama.cpp tg128 | pp ratio | tg ratio |"
echo "|---|---|---|---|---|---|---|---|"
for round in 1 2 3; do for f in bf16 f16; do
  a=$(build/inferd bench latency -m "$M"/qwen2.5-0.5b-shapes-$f.gguf -t 2 -p 512 -n 128 -r 3 --json | tail -1)
  b=$("$PEER" -m "$M"/qwen2.5-0.5b-shapes-$f.gguf -t 2 -p 512 -n 128 -r 3 -o json)
  python3 - "$round" "$f" "$a" "$b" <<'PY'
import json,sys
r,f,a,b=sys.argv[1:]
a=json.loads(a); b={("pp" if x["n_prompt"]>0 else "tg"):x["avg_ts"] for x in json.loads(b)}
print(f"| {r} | {f} | {a['prompt_tokens_per_second']:.1f} | {a['generation_tokens_per_second']:.1f} | {b['pp']:.1f} | {b['tg']:.1f} | {a['prompt_tokens_per_second']/b['pp']:.2f}x | {a['generation_tokens_per_second']/b['tg']:.2f}x |", flush=True)
PY
done; done
