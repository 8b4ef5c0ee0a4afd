#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, clang + ASan + UBSan, preset "fuzz") into
# build-fuzz/ and runs each for a fixed number of inputs, starting from its seed corpus in
# tests/fuzz/corpus/<target>/. Any crash, leak, sanitizer report, timeout (10 s per input) or
# out-of-memory fails the run; the offending input is kept in build-fuzz/fuzz-artifacts/.
#
#   scripts/fuzz-smoke.sh                  every target, FUZZ_RUNS inputs each (default 20000)
#   scripts/fuzz-smoke.sh gguf_fuzzer ...  only these targets
#   FUZZ_SECONDS=60 scripts/fuzz-smoke.sh  a time budget per target instead of a run count
#
# New inputs libFuzzer finds go to a temporary directory, never into the checked-in corpus
# (add the interesting ones there by hand, or regenerate it with tests/fuzz/make_corpus.py).
set -euo pipefail
cd "$(dirname "$0")/.."
all_targets=(gguf_fuzzer safetensors_fuzzer tokenizer_json_fuzzer tokenizer_codec_fuzzer
  generate_request_fuzzer openai_request_fuzzer constraint_fuzzer)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all_targets[@]}")
runs=${FUZZ_RUNS:-20000}
jobs=${KVSERVE_JOBS:-$(nproc)}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/kvserve-ccache}
# -g1 builds: share cached objects between clones at different paths (see .ci/run).
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-true}

if ! command -v clang++ >/dev/null; then
  echo "fuzz-smoke: clang++ not installed (scripts/install-deps.sh installs clang and libclang-rt-14-dev)" >&2
  exit 1
fi
start=$(date +%s)
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz --parallel "$jobs" --target "${targets[@]}"
built=$(date +%s)

limit=(-runs="$runs")
[ -n "${FUZZ_SECONDS:-}" ] && limit=(-max_total_time="$FUZZ_SECONDS")
artifacts=build-fuzz/fuzz-artifacts
mkdir -p "$artifacts"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
for t in "${targets[@]}"; do
  mkdir -p "$work/$t"
  log="$work/$t.log"
  t0=$(date +%s)
  if build-fuzz/tests/fuzz/"$t" "${limit[@]}" -seed=1 -timeout=10 -rss_limit_mb=2048 \
      -max_len=16384 -print_final_stats=1 -artifact_prefix="$artifacts/$t-" \
      "$work/$t" "tests/fuzz/corpus/$t" >"$log" 2>&1; then
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1)
    echo "fuzz-smoke: $t ok: ${execs:-?} inputs, $cov, $(($(date +%s) - t0)) s"
  else
    failed=$((failed + 1))
    echo "fuzz-smoke: $t FAILED (input kept under $artifacts/):"
    grep -v '^#\|^INFO\|^\s*$' "$log" | tail -n 40 | sed 's/^/    /'
  fi
done
echo "fuzz-smoke: build $((built - start)) s; ${#targets[@]} targets, $failed failed"
[ $failed -eq 0 ]
