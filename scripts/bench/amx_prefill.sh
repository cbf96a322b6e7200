#!/usr/bin/env bash
# AMX-INT8 prefill against the VNNI path (issue 20, part 1: pp512 >= 2x VNNI on the Qwen2.5-0.5B
# shapes at Q8_0), for both AMX-INT8 kernels (packed_matmul.h: pipelined, ping-pong). One binary,
# the path chosen per run (INFERD_ISA=vnni|amx, INFERD_AMX_INT8=pipelined|pingpong), rounds
# interleaved so that the VM's slow minutes fall on every variant alike.
#   scripts/bench/amx_prefill.sh [ROUNDS] [MODEL.gguf ...]
# Defaults: 3 rounds; the Qwen2.5-0.5B shapes at Q8_0 and Q4_0 (scripts/peer/make_models.py).
# Prints the one-matrix kernel rates (build/kernels_bench, T=512), then pp512 tokens/s per round
# and the medians' ratios. Needs an AMX CPU: elsewhere it says so and exits 1.
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! grep -q amx_int8 /proc/cpuinfo; then
  echo "amx_prefill.sh: this CPU has no AMX-INT8 (grep amx /proc/cpuinfo: none)" >&2
  exit 1
fi
rounds=${1:-3}
shift || true
M=${INFERD_PEER_DIR:-$HOME/.cache/inferd-peer}/models
models=("$@")
[ ${#models[@]} -gt 0 ] || models=("$M/qwen2.5-0.5b-shapes-q8_0.gguf" "$M/qwen2.5-0.5b-shapes-q4_0.gguf")
variants=("vnni pipelined" "amx pipelined" "amx pingpong")

echo "== one matrix (4864 x 896), integer GOP/s at T=512"
for v in "${variants[@]}"; do
  set -- $v
  echo "-- $1 $2"
  INFERD_ISA=$1 INFERD_AMX_INT8=$2 build/kernels_bench --benchmark_filter='BM_QuantMatmul/.*/512' \
    --benchmark_min_time=0.5 2>/dev/null | awk '/BM_/{for(i=1;i<=NF;i++) if($i ~ /GOP/) g=$i; print $(NF-1), g}'
done

echo "== pp512, tokens/s (inferd bench latency -t 2 -p 512 -n 0 -r 3)"
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
for round in $(seq "$rounds"); do
  for m in "${models[@]}"; do
    for v in "${variants[@]}"; do
      set -- $v
      tps=$(INFERD_ISA=$1 INFERD_AMX_INT8=$2 build/inferd bench latency -m "$m" -t 2 -p 512 -n 0 -r 3 --json |
        tail -1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["prompt_tokens_per_second"])')
      echo "$round $(basename "$m") $1-$2 $tps" | tee -a "$tmp"
    done
  done
done
python3 - "$tmp" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    _, model, variant, tps = line.split()
    runs.setdefault(model, {}).setdefault(variant, []).append(float(tps))
print("| model | VNNI | AMX pipelined | AMX ping-pong | pipelined / VNNI | ping-pong / VNNI |")
print("|---|---|---|---|---|---|")
for model, v in runs.items():
    med = {k: statistics.median(x) for k, x in v.items()}
    vnni, pipe, pp = med["vnni-pipelined"], med["amx-pipelined"], med["amx-pingpong"]
    print(f"| {model} | {vnni:.1f} | {pipe:.1f} | {pp:.1f} | {pipe / vnni:.2f}x | {pp / vnni:.2f}x |")
PY
