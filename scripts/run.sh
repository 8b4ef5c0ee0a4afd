#!/usr/bin/env bash
# Installs what is missing, builds, and runs kvserve on the default model (stories260K).
# Extra arguments go to `kvserve generate`, e.g. scripts/run.sh --prompt "Lily and Tom" --temperature 0.8
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
model="${KVSERVE_MODEL:-../shared/models/stories260K/stories260K.gguf}"
if [ $# -eq 0 ]; then
  set -- --prompt "Once upon a time" --max-tokens 200
fi
exec build/kvserve generate --model "$model" "$@"
