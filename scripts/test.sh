#!/usr/bin/env bash
# Installs what is missing, builds, and runs the default (fast) test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh -DKVSERVE_WERROR=ON
# The Helm chart: lint, render and schema-check offline (skips with a warning when npm is unreachable).
scripts/check-helm.sh
# Last, so its summary is the run's closing line.
ctest --test-dir build --output-on-failure --parallel "$(nproc)" -LE 'gpu|slow'
