#!/usr/bin/env bash
# Builds a sanitizer preset (CMakePresets.json) and runs its tests with ctest.
#
#   scripts/sanitize.sh asan   AddressSanitizer + UBSan (every error fatal, leaks included) into
#                              build-asan/; runs the whole default suite (all but labels gpu|slow,
#                              and the CUDA simulator's engine end to end, sim_e2e)
#   scripts/sanitize.sh tsan   ThreadSanitizer into build-tsan/; builds and runs the tests whose
#                              threads synchronise through kvserve's own primitives (std::mutex,
#                              condition variables, atomics): the engine (loop thread, submitters,
#                              parallel sampling), thread pool, tensor-parallel ranks and
#                              communicators, decode graphs. The gRPC-based tests (worker server,
#                              router, HTTP front, client SDK) are left out: Debian's gRPC and
#                              abseil are not instrumented, so TSan sees neither absl::Mutex nor
#                              gRPC's callback hand-offs and reports hundreds of false races per
#                              test (docs/reliability.md has the counts); ASan runs them.
#
# Extra arguments go to ctest (e.g. -R engine_test). KVSERVE_JOBS sets build and test
# parallelism (default: nproc). Prints the build and test wall times at the end, for CI sizing.
set -euo pipefail
cd "$(dirname "$0")/.."

preset=${1:-}
case "$preset" in
  asan | tsan) shift ;;
  *) echo "usage: $0 asan|tsan [ctest args...]" >&2; exit 2 ;;
esac
jobs=${KVSERVE_JOBS:-$(nproc)}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/kvserve-ccache}
# -g1 builds: share cached objects between clones at different paths (see .ci/run).
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}

# The tests TSan runs (ctest -R) and the targets it therefore builds (see above for why the
# gRPC-based ones are not among them). The rest of the suite is single-threaded or only spawns
# processes.
tsan_tests=(engine_test thread_pool_test cpu_communicator_test tp_model_test tp_shard_test
  tp_device_ranks_test decode_graph_test pipeline_stage_test)

targets=()
ctest_select=(-LE 'gpu|slow')
if [ "$preset" = tsan ]; then
  targets=(--target "${tsan_tests[@]}")
  # A sharded test (kvserve_test SHARDS) runs as <name>_<i>of<N>.
  ctest_select+=(-R "^($(IFS='|'; echo "${tsan_tests[*]}"))(_[0-9]+of[0-9]+)?\$")
  # ignore_noninstrumented_modules: memcpy & co. called from inside Debian's (uninstrumented)
  # abseil, protobuf and gRPC are not checked; kvserve's own accesses all are.
  export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 history_size=4 ignore_noninstrumented_modules=1 suppressions=$PWD/tests/tsan.supp ${TSAN_OPTIONS:-}"
else
  # The CUDA simulator's tests run too (label sim), except the engine end to end on it
  # (sim_e2e: over ten minutes under ASan; the normal build runs it).
  ctest_select=(-LE 'gpu|slow|sim_e2e')
  # Leaks are reported at exit; UBSan findings abort (the build uses -fno-sanitize-recover=all).
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:check_initialization_order=1:detect_stack_use_after_return=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
  export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
fi

start=$(date +%s)
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" --parallel "$jobs" "${targets[@]}"
built=$(date +%s)
status=0
ctest --test-dir "build-$preset" --output-on-failure --parallel "$jobs" "${ctest_select[@]}" "$@" ||
  status=$?
done_at=$(date +%s)
echo "sanitize: $preset build $((built - start)) s, tests $((done_at - built)) s (jobs $jobs)"
exit $status
