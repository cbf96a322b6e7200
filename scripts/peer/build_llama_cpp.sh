#!/usr/bin/env bash
# Builds the peer we compare against: llama.cpp's llama-server, llama-bench and
# llama-batched-bench, from the llama.cpp source that the PyPI sdist of llama-cpp-python carries
# (pinned below). Built outside the repository (never committed), native (AVX-512 / VNNI / AMX
# where the CPU has them), without CURL.
#   scripts/peer/build_llama_cpp.sh            -> $INFERD_PEER_DIR/bin/{llama-server,llama-bench,llama-batched-bench}
# INFERD_PEER_DIR defaults to ~/.cache/inferd-peer. Idempotent: an existing build is kept.
set -euo pipefail
VERSION=0.3.36
PEER_DIR=${INFERD_PEER_DIR:-$HOME/.cache/inferd-peer}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-python3}
[ -n "${PYTHON:-}" ] || [ ! -x "$ROOT/.venv/bin/python" ] || PY="$ROOT/.venv/bin/python"  # scripts/setup's venv
JOBS=${JOBS:-$(nproc)}
BIN="$PEER_DIR/bin"
if [ -x "$BIN/llama-server" ] && [ -x "$BIN/llama-bench" ] && [ -x "$BIN/llama-batched-bench" ] &&
   [ "$(cat "$PEER_DIR/VERSION" 2>/dev/null)" = "$VERSION" ]; then
  echo "peer: llama.cpp of llama-cpp-python $VERSION already built in $BIN"
  exit 0
fi
mkdir -p "$PEER_DIR/src"
cd "$PEER_DIR/src"
if [ ! -d "llama_cpp_python-$VERSION" ]; then
  "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d .
  tar xzf "llama_cpp_python-$VERSION.tar.gz"
fi
SRC="$PEER_DIR/src/llama_cpp_python-$VERSION/vendor/llama.cpp"
cmake -S "$SRC" -B "$PEER_DIR/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
  -DBUILD_SHARED_LIBS=OFF >/dev/null
cmake --build "$PEER_DIR/build" -j "$JOBS" --target llama-server llama-bench llama-batched-bench
mkdir -p "$BIN"
for t in llama-server llama-bench llama-batched-bench; do
  cp "$(find "$PEER_DIR/build" -name "$t" -type f -perm -u+x | head -1)" "$BIN/$t"
done
echo "$VERSION" > "$PEER_DIR/VERSION"
echo "peer: built $(ls "$BIN" | tr '\n' ' ')in $BIN (llama.cpp of llama-cpp-python $VERSION)"
