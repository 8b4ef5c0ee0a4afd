#!/usr/bin/env bash
# One-shot GPU check for a machine with (at least) one NVIDIA GPU, in under 8 minutes:
#   1. the driver version (nvidia-smi) — CUDA 13 needs a driver >= 580;
#   2. configure + build (Release, CUDA on) of the CUDA library, the `gpu` tests and the kernel
#      benchmark, in build-gpu/;
#   3. ctest -L gpu;
#   4. bench/cuda_kernels_bench (decode attention GB/s vs the device's memcpy peak, GEMM TFLOP/s);
#   5. report/gpu-report.md with all of the above.
# Usage: scripts/gpu-check.sh [build-dir]   (exit status: 0 when every step passed)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
REPORT=report/gpu-report.md
mkdir -p report
LOG=$(mktemp -d)
START=$(date +%s)
status=0
elapsed() { echo $(( $(date +%s) - START ))s; }

{
  echo "# GPU check"
  echo
  echo "Date: $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo
} > "$REPORT"

echo "== driver"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=driver_version,name,memory.total --format=csv,noheader | tee "$LOG/smi"
  { echo "## Driver"; echo; echo '```'; cat "$LOG/smi"; nvidia-smi | head -4 | tail -2; echo '```'; echo; } >> "$REPORT"
else
  echo "nvidia-smi not found: no NVIDIA driver" | tee -a "$REPORT"
  status=1
fi

echo "== configure + build ($(elapsed))"
JOBS=$(nproc 2>/dev/null || echo 4)
TARGETS="kvserve kvserve_cuda cuda_ops_test cuda_attention_test cuda_model_test nccl_all_reduce_test cuda_kernels_bench"
if timeout 300 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVSERVE_ENABLE_CUDA=ON \
      >"$LOG/configure" 2>&1 &&
   timeout 300 cmake --build "$BUILD" -j "$JOBS" --target $TARGETS >"$LOG/build" 2>&1; then
  echo "build ok ($(elapsed))"
  echo "## Build: ok ($(elapsed) since start)" >> "$REPORT"
else
  echo "build FAILED"; tail -30 "$LOG/configure" "$LOG/build" 2>/dev/null
  { echo "## Build: FAILED"; echo; echo '```'; tail -40 "$LOG/configure" "$LOG/build" 2>/dev/null; echo '```'; } >> "$REPORT"
  exit 1
fi
echo >> "$REPORT"

echo "== ctest -L gpu ($(elapsed))"
(cd "$BUILD" && timeout 240 ctest -L gpu --output-on-failure) >"$LOG/ctest" 2>&1
ctest_rc=$?
tail -15 "$LOG/ctest"
[ $ctest_rc -eq 0 ] || status=1
{
  echo "## ctest -L gpu: $([ $ctest_rc -eq 0 ] && echo passed || echo FAILED)"
  echo; echo '```'; grep -E "Test +#|tests passed|Skipped|SKIPPED|Failure|Expected|Which is|actual|FAILED" "$LOG/ctest" | head -80; echo '```'; echo
} >> "$REPORT"

echo "== engine end to end: kvserve generate, cpu vs cuda (graphs) vs cuda --enforce-eager ($(elapsed))"
MODEL=${KVSERVE_SHARED_DIR:-../shared}/models/stories260K/stories260K.gguf
gen() {
  timeout 60 "$BUILD/kvserve" generate --model "$MODEL" --prompt "Once upon a time" \
    --temperature 0 --max-tokens 64 --ignore-eos --json "$@" 2>>"$LOG/e2e.err" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["token_ids"])' 2>>"$LOG/e2e.err"
}
cpu_ids=$(gen --device cpu)
graph_ids=$(gen --device cuda)
eager_ids=$(gen --device cuda --enforce-eager)
if [ -n "$cpu_ids" ] && [ "$cpu_ids" = "$graph_ids" ] && [ "$cpu_ids" = "$eager_ids" ]; then
  e2e="passed (64 greedy tokens identical)"
else
  e2e="FAILED"; status=1
fi
echo "engine e2e: $e2e"
{
  echo "## Engine end to end: $e2e"; echo; echo '```'
  echo "cpu:         $cpu_ids"; echo "cuda graphs: $graph_ids"; echo "cuda eager:  $eager_ids"
  tail -5 "$LOG/e2e.err" 2>/dev/null; echo '```'; echo
} >> "$REPORT"

echo "== kernel benchmark ($(elapsed))"
timeout 120 "$BUILD/bench/cuda_kernels_bench" >"$LOG/bench" 2>&1
bench_rc=$?
cat "$LOG/bench"
[ $bench_rc -eq 0 ] || status=1
{ echo "## Kernel benchmark"; echo; sed 's/^# CUDA kernel benchmark$//' "$LOG/bench"; echo; } >> "$REPORT"

echo "Total: $(elapsed), status $status" | tee -a "$REPORT"
echo "report: $REPORT"
exit $status
