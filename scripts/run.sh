#!/usr/bin/env bash
# Installs what is missing, builds, and serves the default model (stories260K) with a local
# cluster: a router on 127.0.0.1:50051 and two workers, until Ctrl-C.
# Extra arguments go to `kvserve up`, e.g. scripts/run.sh --workers 4 --listen 127.0.0.1:6000
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
exec build/kvserve up "$@"
