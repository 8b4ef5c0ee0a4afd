#!/usr/bin/env bash
# Builds the GPU check's binaries HERE (Debian 12 with the CUDA toolkit, no GPU needed) and packs
# them with the shared libraries they need and the test model into one folder, for a GPU machine
# that cannot build kvserve itself: the lent H200's image has nvcc and the CUDA libraries but
# none of the Debian development packages (abseil, gtest, ...) and no network to fetch them.
#
#   scripts/gpu-bundle.sh [--arch 90] [--out gpu-bundle]
#   ... carry gpu-bundle.tar.xz (git-ignored: name it in the device tool's `carry`; the folder
#   itself is over the tool's 64 MiB limit, ICU's data alone is 31 MB), then there:
#   scripts/gpu-check.sh --prebuilt gpu-bundle.tar.xz
#
# The bundle holds: bin/ (the GPU tests, the kernel benchmark, libkvserve_cuda.so beside them
# where they look for it, and libkvserve_cuda_sim.so, so the bundle can be tried here with
# KVSERVE_TEST_DEVICE=cuda-sim), lib/ (every shared library they link except glibc's and CUDA's
# own, which the GPU machine has; the C++ runtime goes to lib/compat/, used only where the machine's
# own libstdc++ is older than the one the binaries were built against, since the machine's own
# tools, compute-sanitizer among them, may need the newer one), shared/ (stories260K and its golden
# outputs) and MANIFEST; and the same packed as <out>.tar.xz.
# The tests read the models from /tmp/kvserve-gpu-bundle/shared, a path gpu-check links to the
# bundle's shared/. Binaries need glibc >= 2.34 and libstdc++ is carried.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
ARCH=90
OUT=$ROOT/gpu-bundle
while [ "$#" -gt 0 ]; do
  case $1 in
    --arch) ARCH=$2; shift ;;
    --out) OUT=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); shift ;;
    -h | --help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "gpu-bundle: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done

SHARED_AT=/tmp/kvserve-gpu-bundle/shared  # compiled into the tests (KVSERVE_SHARED_DIR)
SHARED_SRC=${KVSERVE_SHARED_DIR:-$ROOT/../shared}
NVCC=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$NVCC" ] || { echo "gpu-bundle: no nvcc (set CUDACXX)" >&2; exit 1; }
TESTS=(cuda_ops_test cuda_bf16_ops_test cuda_attention_test cuda_fp8_test cuda_model_test
       nccl_all_reduce_test cuda_engine_test)
BUILD=$ROOT/build-gpu-bundle

launcher=()
command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
mkdir -p "$BUILD"
cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVSERVE_ENABLE_CUDA=ON \
  "-DCMAKE_CUDA_COMPILER=$NVCC" "-DCMAKE_CUDA_ARCHITECTURES=$ARCH" \
  "-DKVSERVE_SHARED_DIR=$SHARED_AT" "${launcher[@]}" > "$BUILD/configure.log" 2>&1 ||
  { tail -20 "$BUILD/configure.log"; exit 1; }
cmake --build "$BUILD" --parallel "$(nproc)" --target "${TESTS[@]}" cuda_kernels_bench \
  kvserve_cuda kvserve_cuda_sim

rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib/compat" "$OUT/shared/models/stories260K"
bins=()
for t in "${TESTS[@]}" cuda_kernels_bench; do
  f=$(find "$BUILD" -name "$t" -type f -executable -print -quit)
  [ -n "$f" ] || { echo "gpu-bundle: $t was not built" >&2; exit 1; }
  strip -o "$OUT/bin/$t" "$f"
  bins+=("$OUT/bin/$t")
done
for so in libkvserve_cuda.so libkvserve_cuda_sim.so; do
  f=$(find "$BUILD" -name "$so" -type f -print -quit)
  strip -o "$OUT/bin/$so" "$f"
  bins+=("$OUT/bin/$so")
done
# Every library the binaries link, but glibc's (the GPU machine's must be used) and CUDA's
# (its driver-matched toolkit's; cuBLAS alone would not fit the carry limit).
ldd "${bins[@]}" 2>/dev/null | awk '/=>/ && $3 ~ /^\// {print $3}' | sort -u |
  grep -v -E '/(libc|libm|libdl|libpthread|librt|libresolv|ld-linux[^/]*)\.so|/libcud|/libcublas|/libnccl' |
  while read -r lib; do
    case $lib in
      */libstdc++.so* | */libgcc_s.so*) cp -L "$lib" "$OUT/lib/compat/" ;;
      *) cp -L "$lib" "$OUT/lib/" ;;
    esac
  done
cp "$SHARED_SRC/models/stories260K/stories260K.gguf" "$SHARED_SRC/models/stories260K/golden.json" \
  "$OUT/shared/models/stories260K/"
{
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), $("$NVCC" --version | tail -n 1)"
  echo "arch sm_$ARCH"
  echo "needs glibc >= $(objdump -T "${bins[@]}" 2>/dev/null | grep -oE 'GLIBC_[0-9.]+' | sort -V | tail -n 1 | cut -d_ -f2)"
  echo "shared $SHARED_AT"
  echo "tests ${TESTS[*]}"
  echo "needs GLIBCXX >= $(objdump -T "${bins[@]}" 2>/dev/null | grep -oE 'GLIBCXX_[0-9.]+' | sort -V | tail -n 1 | cut -d_ -f2)"
} > "$OUT/MANIFEST"
tar -C "$(dirname "$OUT")" -cf - "$(basename "$OUT")" | xz -T0 -6 > "$OUT.tar.xz"
du -sh "$OUT" "$OUT.tar.xz"
cat "$OUT/MANIFEST"
