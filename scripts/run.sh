#!/usr/bin/env bash
# Installs what is missing, builds the kvserve binary (not the tests), and serves the default model
# (stories260K) with a local cluster until Ctrl-C: a router on 127.0.0.1:50051 (gRPC) in front of
# two workers, with the OpenAI-compatible HTTP API on 127.0.0.1:8000 and Prometheus metrics on
# 127.0.0.1:9090. Extra arguments go to `kvserve up`, e.g.
#   scripts/run.sh --workers 4 --listen 127.0.0.1:6000 --http-listen 127.0.0.1:8080
set -euo pipefail
cd "$(dirname "$0")/.."
echo "run.sh: checking the Debian packages kvserve needs to build and serve"
scripts/install-deps.sh --serve
echo "run.sh: building build/kvserve (only the binary; scripts/test.sh builds the tests)"
start=$(date +%s)
scripts/build.sh --target kvserve
echo "run.sh: built in $(( $(date +%s) - start )) s; starting the cluster"

args=("$@")
given() {
  local a
  for a in "${args[@]}"; do
    if [ "$a" = "$1" ] || [[ "$a" == "$1="* ]]; then return 0; fi
  done
  return 1
}
given --http-listen || args+=(--http-listen 127.0.0.1:8000)
given --metrics-listen || args+=(--metrics-listen 127.0.0.1:9090)
exec build/kvserve up "${args[@]}"
