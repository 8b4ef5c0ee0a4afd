#!/usr/bin/env bash
# The shell twin of tests/test_util/ci_skip.h: in CI (CI set to anything but "", "0" or "false";
# .ci/run exports CI=true) a skip is a failure unless it declares why the check cannot run there.
#
# Sourced (scripts/check-helm.sh):
#   ci_skip NAME MESSAGE [WHY_NOT_IN_CI]
#     prints the skip; returns 0 where skipping is allowed (outside CI, or WHY_NOT_IN_CI given),
#     1 in CI without a declared reason.
# Run (a ctest placeholder for tests that could not even be registered, SKIP_RETURN_CODE 77):
#   tests/test_util/ci_skip.sh NAME MESSAGE [WHY_NOT_IN_CI]
#     exits 77 (ctest reports "Skipped") where skipping is allowed, 1 otherwise.

in_ci() {
  case "${CI:-}" in
    "" | 0 | false) return 1 ;;
    *) return 0 ;;
  esac
}

ci_skip() {
  local name=$1 message=$2 why=${3:-}
  if [ -n "$why" ]; then
    echo "$name: WARNING: skipped: $message [skip declared for CI: $why]" >&2
    return 0
  fi
  if in_ci; then
    echo "$name: FAIL: $message; in CI (CI=$CI) a skip needs a declared reason" >&2
    return 1
  fi
  echo "$name: WARNING: skipped: $message" >&2
  return 0
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  [ $# -ge 2 ] || { echo "usage: $0 NAME MESSAGE [WHY_NOT_IN_CI]" >&2; exit 2; }
  if ci_skip "$@"; then exit 77; fi
  exit 1
fi
