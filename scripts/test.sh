#!/usr/bin/env bash
# Installs what is missing, builds, and runs the default (fast) test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh -DKVSERVE_WERROR=ON
# The Helm chart: lint, render and schema-check offline (skips with a warning when npm is unreachable).
scripts/check-helm.sh
status=0
ctest --test-dir build --output-on-failure --parallel "$(nproc)" -LE 'gpu|slow' || status=$?
# Which CPU kernel paths the tests covered on this machine (printed by the kernel and golden
# tests; see tests/kernels/cpu/kernel_test_util.h).
grep -h '^\[ISA paths\]' build/Testing/Temporary/LastTest.log 2>/dev/null | sort | uniq -c || true
exit "$status"
