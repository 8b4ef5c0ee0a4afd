#!/usr/bin/env bash
# Configures and builds kvserve (Release, Ninja) into build/.
# Usage: scripts/build.sh [--target NAME]... [cmake args...]   (no --target: everything)
set -euo pipefail
cd "$(dirname "$0")/.."
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
targets=()
while [ $# -ge 2 ] && [ "$1" = "--target" ]; do
  targets+=(--target "$2")
  shift 2
done
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "$@" >/dev/null
cmake --build build --parallel "$(nproc)" "${targets[@]}"
