#!/usr/bin/env bash
# One-shot check of kvserve's CUDA backend on a machine with NVIDIA GPU(s). It is written for a
# single chance on a bare machine (root, the CUDA 13 toolkit, perhaps no network and no Debian dev
# packages) that has to finish inside a fixed time budget (8 minutes by default):
#
#   1. GPU facts first: driver (CUDA 13 needs >= 580), GPUs, memory, clocks, compute capability,
#      the nvcc found and its version;
#   2. consistency checks: the targets below are declared in the CMakeLists, the models are in the
#      shared directory, install-deps.sh's package list can be read;
#   3. dependencies: the Debian packages of scripts/install-deps.sh (it is run when some are
#      missing, which needs network), cmake, ninja, g++, nvcc;
#   4. configure + build of the GPU targets only, for the present GPUs' architecture only;
#   5. ctest -L gpu with KVSERVE_REQUIRE_GPU=1 (the test helpers fail instead of skipping when no
#      device is usable); any skipped test counts as a failure as well;
#   6. kvserve generate on cpu, cuda (decode graphs) and cuda --enforce-eager: 64 greedy tokens
#      each, all three lists identical;
#   7. cuda_kernels_bench: the target points of docs/gpu.md (decode and prefill attention, GEMMs
#      at serving shapes, the small ops, eager vs graph decode steps), each against the device
#      peak that binds it (bandwidth measured in the same run); a missed target is a warning;
#      --bench-grid runs the whole grid instead (its own limit; the budget grows to match);
#   8. compute-sanitizer memcheck, racecheck and synccheck over cuda_ops_test and a small
#      cuda_attention_test (the slowest step, so it runs last, on what is left of the budget);
#   then one summary table, on stdout and in report/gpu-report.md (full log: report/gpu-check.log).
#
# Every step runs under `timeout`: its own limit, cut further to what is left of the budget. A
# failed step is recorded and the run goes on, so that one failure does not hide the others; only
# a failed configure or build stops it. Exit status: 0 when every check passed, 1 otherwise, 2 for
# a usage error.
#
# --prebuilt DIR runs a bundle made here by scripts/gpu-bundle.sh instead of building (the lent
# H200's image has no Debian development packages and no network).
#
# --dry-run needs no GPU (CI runs it so that this script cannot rot): it prints the plan with the
# resolved paths and architecture and runs only the cheap consistency checks (step 2), failing
# when one of them does. See --help for the flags.
set -uo pipefail

# ---- What the check builds and needs. The dry run verifies these against the tree. ----

# Test targets: each is built, and `ctest -L gpu` must run it and see it pass.
GPU_TESTS=(cuda_ops_test cuda_bf16_ops_test cuda_attention_test cuda_fp8_test cuda_model_test
           nccl_all_reduce_test cuda_engine_test)
# Also built: the CLI (end-to-end check), the backend library it dlopens, the kernel benchmark.
OTHER_TARGETS=(kvserve kvserve_cuda cuda_kernels_bench)
# Needed in the shared data directory.
MODEL_FILES=(models/stories260K/stories260K.gguf models/stories260K/golden.json)
E2E_MODEL=models/stories260K/stories260K.gguf
E2E_PROMPT='Once upon a time'
E2E_TOKENS=64
# Packages of install-deps.sh that building and running the GPU targets does not need (fuzzing,
# plots, the Python client, the compiler cache): when missing they are reported, not a failure.
OPTIONAL_PKGS=(ccache gnuplot-nox clang libclang-rt-14-dev python3-grpcio python3-protobuf)
# The compute-sanitizer runs of cuda_attention_test keep to these tests (plus KVSERVE_TEST_SMALL=1):
# the sanitizers slow kernels down 10-100x.
ATTENTION_FILTER='*Decode*:*Prefill*'
SANITIZER_TOOLS=(memcheck racecheck synccheck)
MIN_DRIVER_CUDA13=580   # the oldest Linux driver that runs CUDA 13 code
MIN_DRIVER_CUDA12=525
MIN_CMAKE=3.25          # cmake_minimum_required of CMakeLists.txt
MIN_ARCH_CUDA13=75      # CUDA 13 dropped everything older than Turing (sm_75)

# Step limits in seconds (each is cut further to what is left of the budget).
T_SMI=20 T_INSTALL=180 T_CONFIGURE=120 T_BUILD=330 T_CTEST=180 T_GENERATE=60 T_BENCH=90
# cuda_kernels_bench --grid (--bench-grid); the default budget grows by the difference.
T_BENCH_GRID=300
T_SANITIZER=90
RESERVE=15   # kept back at the end: the 10 s kill grace of `timeout` and writing the report
MIN_STEP=10  # a step that would get less than this is not started (recorded as a failure)

usage() {
  cat <<EOF
Usage: scripts/gpu-check.sh [options]

Builds kvserve's CUDA targets for the GPU(s) present and checks them: ctest -L gpu, an end-to-end
'kvserve generate' (cpu vs cuda vs cuda --enforce-eager), the kernel benchmark and
compute-sanitizer. Writes report/gpu-report.md (summary) and report/gpu-check.log (everything).

Options:
  --dry-run          print the plan (steps, commands, resolved paths, architecture) and run only
                     the consistency checks; builds and runs nothing; no GPU needed
  --arch N           CUDA architecture(s) to build, e.g. 90 or "80;90" (default: the compute
                     capability nvidia-smi reports for the GPUs present)
  --build-dir D      build directory (default: build-gpu)
  --shared DIR       shared data directory with models/ (default: \$KVSERVE_SHARED_DIR, else
                     ../shared beside the checkout, else ./shared, else ./shared-data)
  --report-dir D     where gpu-report.md, gpu-check.log and ctest-gpu.xml go (default: report)
  --budget S         total time budget in seconds (default: 480; 690 with --bench-grid)
  --jobs N           build parallelism (default: nproc)
  --no-install       do not run scripts/install-deps.sh when packages are missing
  --prebuilt DIR     build nothing: run the binaries of a bundle made by scripts/gpu-bundle.sh
                     (its folder, or its .tar.xz, unpacked first under \$TMPDIR)
                     (for a GPU machine without the Debian development packages, like the
                     lent H200 image); the kvserve generate step is left out (not bundled)
  --no-sanitizers    leave out the compute-sanitizer runs
  --bench-grid       run the kernel benchmark's whole grid (docs/gpu.md: decode batch 1-256 x
                     context 1k-128k, prefill 512-16k, GEMMs at m = 1-4096, eager vs graph steps)
                     instead of its target points: up to ${T_BENCH_GRID}s instead of
                     ${T_BENCH}s; the default budget grows by the difference
  -h, --help         this text

Environment: CUDACXX (nvcc to use), CUDA_HOME, KVSERVE_SHARED_DIR.
Exit status: 0 when every check passed, 1 when one failed, 2 for a usage error.
EOF
}

# ---- Arguments (paths given by the caller are taken relative to the caller's directory) ----

abs_path() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$PWD/$1" ;; esac; }
trim() { local s=${1#"${1%%[![:space:]]*}"}; printf '%s' "${s%"${s##*[![:space:]]}"}"; }
# join_notes A B ...: "A; B; ..." (empty ones left out).
join_notes() { local out='' n; for n in "$@"; do [ -n "$n" ] && out+="${out:+; }$n"; done; printf '%s' "$out"; }
need_value() { [ "$#" -ge 2 ] || { echo "gpu-check: $1 needs a value (see --help)" >&2; exit 2; }; }

DRY_RUN=0 ARCH='' BUILD='' SHARED_ARG='' REPORT_DIR='' BUDGET='' JOBS='' INSTALL=1 SANITIZE=1
BENCH_GRID=0
PREBUILT=''  # a folder made by scripts/gpu-bundle.sh: nothing is built here
while [ "$#" -gt 0 ]; do
  case $1 in
    --dry-run) DRY_RUN=1 ;;
    --arch) need_value "$@"; ARCH=$2; shift ;;
    --arch=*) ARCH=${1#*=} ;;
    --build-dir) need_value "$@"; BUILD=$(abs_path "$2"); shift ;;
    --build-dir=*) BUILD=$(abs_path "${1#*=}") ;;
    --shared) need_value "$@"; SHARED_ARG=$(abs_path "$2"); shift ;;
    --shared=*) SHARED_ARG=$(abs_path "${1#*=}") ;;
    --report-dir) need_value "$@"; REPORT_DIR=$(abs_path "$2"); shift ;;
    --report-dir=*) REPORT_DIR=$(abs_path "${1#*=}") ;;
    --budget) need_value "$@"; BUDGET=$2; shift ;;
    --budget=*) BUDGET=${1#*=} ;;
    --jobs) need_value "$@"; JOBS=$2; shift ;;
    --jobs=*) JOBS=${1#*=} ;;
    --no-install) INSTALL=0 ;;
    --prebuilt) need_value "$@"; PREBUILT=$(abs_path "$2"); shift ;;
    --prebuilt=*) PREBUILT=$(abs_path "${1#*=}") ;;
    --no-sanitizers) SANITIZE=0 ;;
    --bench-grid) BENCH_GRID=1 ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "gpu-check: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) BUILD=$(abs_path "$1") ;;  # the old interface: a lone build directory
  esac
  shift
done
[[ $ARCH =~ ^([0-9]+[a-z]?(;[0-9]+[a-z]?)*)?$ ]] ||
  { echo "gpu-check: --arch '$ARCH' is not like 90 or \"80;90\"" >&2; exit 2; }
if [ -z "$BUDGET" ]; then
  BUDGET=480
  if [ "$BENCH_GRID" = 1 ]; then BUDGET=$((BUDGET + T_BENCH_GRID - T_BENCH)); fi
fi
[[ $BUDGET =~ ^[0-9]+$ ]] || { echo "gpu-check: --budget wants seconds" >&2; exit 2; }
[[ $JOBS =~ ^[0-9]*$ ]] || { echo "gpu-check: --jobs wants a number" >&2; exit 2; }

cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd -P)
BUILD=${BUILD:-$ROOT/build-gpu}
# A bundle's binaries sit in its bin/ (libkvserve_cuda.so beside them); its tests read the models
# from BUNDLE_SHARED, which points at the bundle's shared/ (see step_bundle).
BUNDLE_SHARED=/tmp/kvserve-gpu-bundle/shared
# A packed bundle is unpacked first (with python3 where the machine has no xz).
if [ "${PREBUILT%.tar.xz}" != "$PREBUILT" ] && [ "$DRY_RUN" = 0 ]; then
  unpack_to=$(mktemp -d "${TMPDIR:-/tmp}/kvserve-bundle.XXXXXX") || exit 2
  if command -v xz > /dev/null; then
    xz -dc "$PREBUILT" | tar -C "$unpack_to" -xf - || { echo "gpu-check: cannot unpack $PREBUILT" >&2; exit 2; }
  else
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
      "$PREBUILT" "$unpack_to" || { echo "gpu-check: cannot unpack $PREBUILT" >&2; exit 2; }
  fi
  PREBUILT=$(find "$unpack_to" -mindepth 2 -maxdepth 2 -name MANIFEST -printf '%h\n' -quit)
  [ -n "$PREBUILT" ] || { echo "gpu-check: no MANIFEST in the archive" >&2; exit 2; }
fi
if [ -n "$PREBUILT" ]; then BUILD=$PREBUILT/bin SHARED_ARG=${SHARED_ARG:-$PREBUILT/shared}; fi
REPORT_DIR=${REPORT_DIR:-$ROOT/report}
REPORT=$REPORT_DIR/gpu-report.md
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 8)}
SECONDS=0  # bash counts the run's wall time from here
START_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)

# ---- Output, records and the report ----

LOG_FILE=''  # the full log; stays empty in a dry run, which writes nothing
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX") || exit 2
trap 'rm -rf "$WORK"' EXIT
DETAILS=$WORK/details.md  # the report's sections after the summary, appended by the steps

say() {
  printf '%s\n' "$*"
  if [ -n "$LOG_FILE" ]; then printf '%s\n' "$*" >> "$LOG_FILE"; fi
}
dry() { [ "$DRY_RUN" = 1 ]; }
# A command as one line a shell would take back (arguments quoted only where they need it;
# "$NAME" placeholders of the dry run stay as they are).
quote_cmd() {
  local a out='' safe='^[A-Za-z0-9_./=:,@%+$-]+$'
  for a in "$@"; do
    if [[ $a =~ $safe ]]; then out+="$a "; else out+="'${a//\'/\'\\\'\'}' "; fi
  done
  printf '%s' "${out% }"
}
show_cmd() { say "    \$ $(quote_cmd "$@")"; }
# Appends stdin to the report's details (real runs only).
detail() { if dry; then cat > /dev/null; else cat >> "$DETAILS"; fi; }

FACT_K=() FACT_V=()
fact() { FACT_K+=("$1"); FACT_V+=("${2//|//}"); }

NAMES=() STATUS=() TIMES=() NOTES=() FAILS=0
# record CHECK PASS|FAIL|WARN|SKIP SECONDS NOTE
record() {
  NAMES+=("$1") STATUS+=("$2") TIMES+=("$3") NOTES+=("${4//|//}")
  if [ "$2" = FAIL ]; then FAILS=$((FAILS + 1)); fi
  say "  -> $2  $1 (${3}s)${4:+: $4}"
  write_report  # after every check, so that a run killed from outside still leaves its report
}

BENCH_NAME=() BENCH_VALUE=() BENCH_RATIO=()

summary_md() {
  local i state
  if [ "$FAILS" -gt 0 ]; then state="FAIL ($FAILS failed)"; else state=PASS; fi
  [ "${1:-}" = running ] && state="RUNNING ($FAILS failed so far)"
  echo "# kvserve GPU check: $state"
  echo
  echo "Started $START_DATE, commit $COMMIT, host $(hostname 2>/dev/null || echo '?'); took" \
    "${SECONDS}s of a ${BUDGET}s budget."
  echo
  echo "| machine | |"
  echo "|---|---|"
  for i in "${!FACT_K[@]}"; do echo "| ${FACT_K[i]} | ${FACT_V[i]} |"; done
  echo
  echo "| check | result | time | note |"
  echo "|---|---|---:|---|"
  for i in "${!NAMES[@]}"; do
    echo "| ${NAMES[i]} | ${STATUS[i]} | ${TIMES[i]}s | ${NOTES[i]} |"
  done
  if [ "${#BENCH_NAME[@]}" -gt 0 ]; then
    echo
    echo "| benchmark | result | vs device peak |"
    echo "|---|---|---|"
    for i in "${!BENCH_NAME[@]}"; do
      echo "| ${BENCH_NAME[i]} | ${BENCH_VALUE[i]} | ${BENCH_RATIO[i]} |"
    done
  fi
}

write_report() {
  dry && return 0
  { summary_md "${1:-running}"; echo; cat "$DETAILS" 2>/dev/null; } > "$REPORT.tmp" &&
    mv -f "$REPORT.tmp" "$REPORT"
}

# Ends the run: the summary on stdout and in the report, and the exit status.
finish() {
  trap - INT TERM
  if dry; then
    say ""
    if [ "$DRY_ERRORS" -gt 0 ]; then
      say "dry run: $DRY_ERRORS consistency error(s) (above); a real run would record them as failures"
      exit 1
    fi
    say "dry run: plan printed, consistency checks passed"
    exit 0
  fi
  write_report final
  say ""
  summary_md final | tee -a "$LOG_FILE"
  say ""
  say "report: $REPORT   full log: $LOG_FILE"
  [ "$FAILS" -eq 0 ] && exit 0
  exit 1
}
# On Ctrl-C or TERM: stop what runs (`timeout` passes the signal on to its command), keep the report.
# shellcheck disable=SC2317  # reached through the trap below
on_signal() {
  trap - INT TERM
  if [ -n "$SAMPLER" ]; then kill "$SAMPLER" 2>/dev/null; fi
  if [ -n "$CHILD" ]; then kill -TERM "$CHILD" 2>/dev/null; wait "$CHILD" 2>/dev/null; fi
  say ""
  say "gpu-check: interrupted"
  record "run" FAIL "$SECONDS" "interrupted by a signal"
  finish
}
trap on_signal INT TERM

# ---- Running commands under the budget ----

# limit_for CAP [KEEP]: the seconds a step may take: CAP, or less when the budget says so. KEEP
# seconds are held back for the steps after it unless that leaves it too little to start; 0 means
# there is not enough time left to start the step at all.
limit_for() {
  local cap=$1 keep=${2:-0} left lim
  left=$((BUDGET - SECONDS - RESERVE))
  lim=$cap
  if [ $((left - keep)) -lt "$lim" ]; then lim=$((left - keep)); fi
  if [ "$lim" -lt "$MIN_STEP" ]; then lim=$(( left < cap ? left : cap )); fi
  if [ "$lim" -lt "$MIN_STEP" ]; then lim=0; fi
  echo "$lim"
}

# run_timed LIMIT LOG CMD...: runs CMD under `timeout` (killed 10 s after TERM if need be), its
# stdout and stderr into LOG (a fresh file for each call) and then the full log, not onto the
# console. Sets RC (124 or 137: timed out) and DUR (seconds).
RC=0 DUR=0 CHILD='' SAMPLER=''
run_timed() {
  local limit=$1 log=$2 t0=$SECONDS
  shift 2
  printf '\n$ %s  # timeout %ss\n' "$(quote_cmd "$@")" "$limit" >> "$log"
  # In the background, then `wait`: bash runs a trap only once the foreground command is over, and
  # `timeout` puts its command in a process group of its own, out of reach of Ctrl-C.
  timeout --kill-after=10 "$limit" "$@" < /dev/null >> "$log" 2>&1 &
  CHILD=$!
  wait "$CHILD"
  RC=$?
  CHILD=''
  DUR=$((SECONDS - t0))
  if timed_out; then echo "(stopped: timeout after ${limit}s)" >> "$log"; fi
  cat "$log" >> "$LOG_FILE"
  return 0
}
timed_out() { [ "$RC" -eq 124 ] || [ "$RC" -eq 137 ]; }
rc_note() { if timed_out; then echo "timed out"; else echo "exit $RC"; fi; }

# Prints LOG's lines that explain a failure (at most N), indented, and adds them to the report.
show_failure() {
  local title=$1 log=$2 n=${3:-25} lines
  lines=$(grep -E -i -- 'error|fail|expected|which is|actual|abort|assert|skipped|not run|timeout|stopped' \
    "$log" | grep -v -E '^\$ ' | head -n "$n")
  [ -n "$lines" ] || lines=$(tail -n "$n" "$log")
  printf '%s\n' "$lines" | sed 's/^/      /' | tee -a "$LOG_FILE"
  { echo "### $title"; echo; echo '```'; printf '%s\n' "$lines"; echo '```'; echo; } | detail
}

# find_bin NAME: the executable NAME in the build tree (the first found).
find_bin() {
  find "$BUILD" -name "$1" -type f -executable -print -quit 2>/dev/null
}

# ---- Locating things ----

# nvcc: $CUDACXX, then PATH, then /usr/local/cuda, then the newest /usr/local/cuda-*.
find_nvcc() {
  local c
  if [ -n "${CUDACXX:-}" ]; then
    c=$(command -v "$CUDACXX" 2>/dev/null) && [ -x "$c" ] && { echo "$c"; return 0; }
    echo "gpu-check: CUDACXX=$CUDACXX is not an executable; looking elsewhere" >&2
  fi
  c=$(command -v nvcc 2>/dev/null) && { echo "$c"; return 0; }
  [ -x /usr/local/cuda/bin/nvcc ] && { echo /usr/local/cuda/bin/nvcc; return 0; }
  c=$(for f in /usr/local/cuda-*/bin/nvcc; do [ -x "$f" ] && echo "$f"; done | sort -V | tail -n 1)
  [ -n "$c" ] && { echo "$c"; return 0; }
  return 1
}

find_sanitizer() {
  local c
  for c in "${CUDA_HOME:-/nonexistent}/bin/compute-sanitizer" "$NVCC_DIR/compute-sanitizer" \
           "${CUDA_HOME:-/nonexistent}/compute-sanitizer/compute-sanitizer" \
           "$(dirname "$NVCC_DIR")/compute-sanitizer/compute-sanitizer"; do
    [ -x "$c" ] && { echo "$c"; return 0; }
  done
  command -v compute-sanitizer 2>/dev/null
}

# Shared data: --shared, $KVSERVE_SHARED_DIR, ../shared beside the checkout, ./shared (the copy
# that travels with a working tree), ./shared-data (an ignored folder the models can travel in).
resolve_shared() {
  local c
  if [ -n "$SHARED_ARG" ]; then
    SHARED=$SHARED_ARG SHARED_FROM=--shared
  elif [ -n "${KVSERVE_SHARED_DIR:-}" ]; then
    SHARED=$(abs_path "$KVSERVE_SHARED_DIR") SHARED_FROM=KVSERVE_SHARED_DIR
  else
    SHARED=$ROOT/../shared SHARED_FROM="none of ../shared, ./shared, ./shared-data exists"
    for c in "$ROOT/../shared" "$ROOT/shared" "$ROOT/shared-data"; do
      if [ -d "$c" ]; then SHARED=$c SHARED_FROM=default; break; fi
    done
  fi
  if [ -d "$SHARED" ]; then SHARED=$(cd "$SHARED" && pwd -P); fi
}

# The package list of scripts/install-deps.sh (its `packages=( ... )` block, comments dropped).
read_packages() {
  sed -n '/^packages=(/,/^)/p' "$ROOT/scripts/install-deps.sh" 2>/dev/null |
    sed -e 's/#.*//' -e 's/^packages=(//' -e 's/)//' | tr -s ' \t' '\n' | sed '/^$/d'
}
pkg_installed() {
  # shellcheck disable=SC2016  # ${Status} is dpkg-query's format field, not a shell variable
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}
is_optional() {
  local p
  for p in "${OPTIONAL_PKGS[@]}"; do [ "$p" = "$1" ] && return 0; done
  return 1
}

# The text of every CMakeLists.txt and *.cmake of the checkout (build trees left out), comments
# dropped, on one line, so that a call spread over several lines still matches.
cmake_text() {
  find "$ROOT" \( -path "$ROOT/build*" -o -path "$ROOT/.git" -o -path "$ROOT/shared" \
       -o -path "$ROOT/shared-data" -o -path "$ROOT/report" \) -prune -o \
       \( -name CMakeLists.txt -o -name '*.cmake' \) -type f -print0 |
    xargs -0 cat | sed 's/#.*//' | tr '\n\t' '  '
}
# declared NAME TEXT: whether NAME is declared as a target in TEXT: add_executable(NAME,
# add_library(NAME, kvserve_test(NAME, kvserve_bench(NAME, kvserve_library(NAME, or listed in a
# foreach() whose body declares it (tests/kernels/cuda does `foreach(test a b c) kvserve_test(${test}`).
declared() {
  local name=$1 text=$2 decl='(add_executable|add_library|kvserve_test|kvserve_bench|kvserve_library|kvserve_[a-z_]+_(test|bench))'
  local direct="$decl *\\( *${name}[ )]"
  local listed="foreach *\\( *[A-Za-z_]+ ([^)]* )?${name}( [^)]*)?\\) *$decl *\\( *\\\$\\{"
  [[ $text =~ $direct ]] || [[ $text =~ $listed ]]
}

# ---- Steps ----

COMMIT=$( { timeout 10 git rev-parse --short HEAD &&
            timeout 10 git status --porcelain --untracked-files=no | grep -q . && echo '+dirty'; } 2>/dev/null |
          tr -d '\n')
COMMIT=${COMMIT:-?}
NVCC='' NVCC_DIR='' NVCC_VERSION='' SMI='' GPU_COUNT=0 DRIVER=''
DRY_ERRORS=0

step_facts() {
  local t0=$SECONDS out rc q line idx name drv mem cc sm smmax mc mcmax cuda_v need arch a names=''
  say "== [1/8] GPU, driver and toolkit"
  # nvcc first: the driver needed depends on the toolkit's version.
  if NVCC=$(find_nvcc); then
    NVCC_DIR=$(dirname "$NVCC")
    export CUDACXX=$NVCC PATH="$NVCC_DIR:$PATH"
    export CUDA_HOME=${CUDA_HOME:-$(dirname "$NVCC_DIR")}
    NVCC_VERSION=$(timeout "$T_SMI" "$NVCC" --version 2>/dev/null |
                   sed -n 's/.*release [0-9.]*, V\([0-9.]*\).*/\1/p' | head -n 1)
    fact toolkit "nvcc ${NVCC_VERSION:-?} ($NVCC)"
    say "  nvcc: $NVCC (${NVCC_VERSION:-version unknown}); CUDACXX exported, $NVCC_DIR put on PATH, CUDA_HOME=$CUDA_HOME"
  else
    NVCC=''
    fact toolkit "nvcc not found"
    say "  nvcc: not found (CUDACXX, PATH, /usr/local/cuda/bin, /usr/local/cuda-*/bin)"
  fi
  need=$MIN_DRIVER_CUDA13
  if [ -n "$NVCC_VERSION" ] && [ "${NVCC_VERSION%%.*}" -lt 13 ]; then need=$MIN_DRIVER_CUDA12; fi

  SMI=$(command -v nvidia-smi 2>/dev/null || true)
  q=index,name,driver_version,memory.total,compute_cap,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem
  if [ -z "$SMI" ]; then
    if dry; then
      say "  nvidia-smi: not here (no NVIDIA driver); a real run queries"
      show_cmd nvidia-smi "--query-gpu=$q" --format=csv,noheader
      say "  and builds for ${ARCH:-the compute capability it reports (9.0 -> 90)}"
    else
      record "driver and GPUs" FAIL $((SECONDS - t0)) "nvidia-smi not found: no NVIDIA driver"
    fi
    ARCH=${ARCH:-90}
    return
  fi
  out=$(timeout "$T_SMI" "$SMI" "--query-gpu=$q" --format=csv,noheader 2>&1)
  rc=$?
  if [ "$rc" -ne 0 ]; then
    # An old driver may not know every field: the driver version alone, to say why.
    DRIVER=$(timeout "$T_SMI" "$SMI" --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)
    fact driver "${DRIVER:-unknown}"
    say "  nvidia-smi failed (exit $rc): $out"
    dry || record "driver and GPUs" FAIL $((SECONDS - t0)) \
      "nvidia-smi --query-gpu failed (exit $rc); driver ${DRIVER:-unknown}, CUDA 13 needs >= $need"
    ARCH=${ARCH:-90}
    return
  fi
  arch=''
  # One CSV line per GPU, a space after each comma (trimmed: names hold spaces).
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    IFS=',' read -r idx name drv mem cc sm smmax mc mcmax <<< "$line"
    idx=$(trim "$idx") name=$(trim "$name") drv=$(trim "$drv") mem=$(trim "$mem") cc=$(trim "$cc")
    sm=$(trim "$sm") smmax=$(trim "$smmax") mc=$(trim "$mc") mcmax=$(trim "$mcmax")
    GPU_COUNT=$((GPU_COUNT + 1))
    [ -n "$DRIVER" ] || DRIVER=$drv
    say "  GPU $idx: $name, $mem, sm $cc, SM clock $sm (max $smmax), memory clock $mc (max $mcmax)"
    if [ "$GPU_COUNT" -eq 1 ]; then
      names=$name
      fact memory "$mem per GPU"
      fact "clocks (GPU 0, idle)" "SM $sm of max $smmax; memory $mc of max $mcmax"
    elif [ "$name" != "${names%% +*}" ]; then
      names="$names + $name"
    fi
    [[ $cc =~ ^[0-9]+\.[0-9]+$ ]] || continue  # "[N/A]" and the like
    a=${cc//./}
    case ";$arch;" in *";$a;"*) ;; *) arch=${arch:+$arch;}$a ;; esac
  done <<< "$out"
  cuda_v=$(timeout "$T_SMI" "$SMI" 2>/dev/null | grep -o 'CUDA Version: *[0-9.]*' | head -n 1 | sed 's/.*: *//')
  fact GPUs "$GPU_COUNT x $names (sm ${arch//;/, sm })"
  fact driver "$DRIVER (supports CUDA ${cuda_v:-?})"
  say "  driver $DRIVER (CUDA ${cuda_v:-?}), $GPU_COUNT GPU(s)"
  local notes=() ok=PASS major=${DRIVER%%.*} tk=${NVCC_VERSION%.*}
  if [ "$GPU_COUNT" -eq 0 ] || [ -z "$arch" ]; then
    ok=FAIL
    notes+=("nvidia-smi lists no GPU with a compute capability: $(head -n 1 <<< "$out")")
  fi
  if [ -n "$ARCH" ]; then
    say "  architecture: $ARCH (--arch; the GPUs are sm ${arch:-?})"
  else
    ARCH=${arch:-90}
    if [ -n "$arch" ]; then say "  architecture: $ARCH (from nvidia-smi)"
    else say "  architecture: none reported; building for 90"; fi
  fi
  if ! [[ $major =~ ^[0-9]+$ ]] || [ "$major" -lt "$need" ]; then
    ok=FAIL
    notes+=("driver $DRIVER is too old: CUDA ${tk:-13} needs >= $need; nothing CUDA will run")
  fi
  for a in ${ARCH//;/ }; do
    if [ "${a//[a-z]/}" -lt "$MIN_ARCH_CUDA13" ] && [ "${NVCC_VERSION%%.*}" != 12 ]; then
      ok=FAIL
      notes+=("sm_$a is not supported by CUDA 13 (sm_$MIN_ARCH_CUDA13 and newer)")
    fi
  done
  [ "$ok" = PASS ] && notes=("driver $DRIVER >= $need, $GPU_COUNT x $names")
  if dry; then
    say "  (dry run) driver check: $ok: $(join_notes "${notes[@]}")"
  else
    record "driver and GPUs" "$ok" $((SECONDS - t0)) "$(join_notes "${notes[@]}")"
  fi
}

step_consistency() {
  local t0=$SECONDS errs=() warns=() text t f v flag
  say "== [2/8] consistency checks (targets, models, package list)"
  text=$(cmake_text)
  for t in "${GPU_TESTS[@]}" "${OTHER_TARGETS[@]}"; do
    declared "$t" "$text" ||
      errs+=("target $t is not declared in any CMakeLists.txt (kvserve_test/kvserve_bench/add_executable/add_library)")
  done
  say "  shared data: $SHARED ($SHARED_FROM)"
  for f in "${MODEL_FILES[@]}"; do
    [ -s "$SHARED/$f" ] || errs+=("missing $SHARED/$f")
  done
  [ "${#PKGS[@]}" -gt 0 ] || errs+=("no package list read from scripts/install-deps.sh (packages=( ... ))")
  for f in "${OPTIONAL_PKGS[@]}"; do
    printf '%s\n' "${PKGS[@]}" | grep -qx -- "$f" ||
      warns+=("OPTIONAL_PKGS names $f, which install-deps.sh no longer lists")
  done
  f=$ROOT/bench/cuda_kernels_bench.cc
  if [ ! -f "$f" ]; then
    errs+=("bench/cuda_kernels_bench.cc is missing")
  elif [ "$BENCH_GRID" = 1 ] && ! grep -qF '"--grid"' "$f"; then
    errs+=("--bench-grid: bench/cuda_kernels_bench.cc has no --grid flag")
  fi
  f=$(find "$ROOT/tests" -name cuda_attention_test.cc -print -quit 2>/dev/null)
  if [ -z "$f" ]; then
    errs+=("cuda_attention_test.cc not found under tests/")
  elif ! grep -q -E 'Decode|Prefill' "$f"; then
    errs+=("$f has no Decode or Prefill tests: the sanitizer filter $ATTENTION_FILTER would run nothing")
  fi
  # Soft checks: what this script relies on the tree to honour. Until the tree does, they
  # are warnings (the skip scan still catches a skipped test; a missing CLI flag fails the run).
  for v in KVSERVE_REQUIRE_GPU KVSERVE_TEST_DEVICE KVSERVE_TEST_SMALL; do
    grep -rqs -- "$v" "$ROOT/tests" || warns+=("no test reads $v yet")
  done
  for flag in --device --enforce-eager --keep-f32-weights --ignore-eos --json; do
    grep -rqsF -- "$flag\"" "$ROOT/client" || warns+=("kvserve has no $flag flag yet (client/)")
  done
  for v in "${warns[@]}"; do say "  warning: $v"; done
  for v in "${errs[@]}"; do say "  ERROR: $v"; done
  if dry; then
    DRY_ERRORS=$((DRY_ERRORS + ${#errs[@]}))
    [ "${#errs[@]}" -eq 0 ] && say "  all consistency checks passed (${#warns[@]} warning(s))"
  elif [ "${#errs[@]}" -gt 0 ]; then
    record "consistency checks" FAIL $((SECONDS - t0)) "$(join_notes "${errs[@]}")"
  else
    record "consistency checks" PASS $((SECONDS - t0)) "${#warns[@]} warning(s), see the log"
  fi
}

step_deps() {
  local t0=$SECONDS p lim missing_req=() missing_opt=() tools_missing=() cm notes=() st=PASS
  say "== [3/8] dependencies"
  if [ -n "$PREBUILT" ]; then
    local need have
    need=$(sed -n 's/^needs glibc >= //p' "$PREBUILT/MANIFEST" 2>/dev/null)
    have=$(ldd --version 2>/dev/null | head -n 1 | grep -oE '[0-9]+\.[0-9]+$')
    say "  prebuilt bundle $PREBUILT: nothing to build; glibc ${have:-?} here, ${need:-?} needed"
    dry && return
    if [ -z "$need" ] || [ -z "$have" ]; then
      record "dependencies" WARN $((SECONDS - t0)) "prebuilt: glibc version unknown (need ${need:-?}, have ${have:-?})"
    elif [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n 1)" = "$need" ]; then
      record "dependencies" PASS $((SECONDS - t0)) "prebuilt bundle; glibc $have >= $need"
    else
      record "dependencies" FAIL $((SECONDS - t0)) "prebuilt bundle needs glibc $need, this machine has $have"
    fi
    return
  fi
  if ! command -v dpkg-query > /dev/null; then
    say "  dpkg-query not found: not a Debian system, package check left out (configure will tell)"
    notes+=("no dpkg: packages not checked")
    st=WARN
  else
    for p in "${PKGS[@]}"; do
      pkg_installed "$p" && continue
      if is_optional "$p"; then missing_opt+=("$p"); else missing_req+=("$p"); fi
    done
    say "  ${#PKGS[@]} packages in install-deps.sh; missing: ${missing_req[*]:-none}${missing_opt[*]:+ (optional: ${missing_opt[*]})}"
    if [ "${#missing_req[@]}" -gt 0 ]; then
      if dry; then
        say "  would run (timeout ${T_INSTALL}s) scripts/install-deps.sh, then check again"
      elif [ "$INSTALL" = 0 ]; then
        say "  --no-install: not installing"
      else
        lim=$(limit_for "$T_INSTALL" 300)
        if [ "$lim" -gt 0 ]; then
          say "  running scripts/install-deps.sh (timeout ${lim}s; needs network)"
          run_timed "$lim" "$WORK/install.log" "$ROOT/scripts/install-deps.sh"
          [ "$RC" -eq 0 ] || { say "  install-deps.sh failed ($(rc_note)):"; tail -n 5 "$WORK/install.log" | sed 's/^/      /'; }
          local still=()
          for p in "${missing_req[@]}"; do pkg_installed "$p" || still+=("$p"); done
          missing_req=("${still[@]}")
        fi
      fi
    fi
    if [ "${#missing_req[@]}" -gt 0 ] && ! dry; then
      st=FAIL
      notes+=("missing packages: ${missing_req[*]}")
      say "  STILL MISSING (the build needs them): ${missing_req[*]}"
    fi
    [ "${#missing_opt[@]}" -gt 0 ] && notes+=("optional missing: ${missing_opt[*]}")
  fi
  for p in cmake ninja g++ timeout; do
    command -v "$p" > /dev/null || tools_missing+=("$p")
  done
  [ -n "$NVCC" ] || tools_missing+=(nvcc)
  if command -v cmake > /dev/null; then
    cm=$(cmake --version 2>/dev/null | head -n 1 | awk '{print $3}')
    if [ "$(printf '%s\n%s\n' "$MIN_CMAKE" "$cm" | sort -V | head -n 1)" != "$MIN_CMAKE" ]; then
      tools_missing+=("cmake>=$MIN_CMAKE (have $cm)")
    fi
  fi
  say "  tools: cmake ${cm:-missing}, ninja $(ninja --version 2>/dev/null || echo missing)," \
    "g++ $(g++ -dumpfullversion 2>/dev/null || echo missing), nvcc ${NVCC:-missing}"
  if [ "${#tools_missing[@]}" -gt 0 ]; then
    st=FAIL
    notes+=("missing tools: ${tools_missing[*]}")
  fi
  if dry; then
    [ "${#tools_missing[@]}" -eq 0 ] || say "  (here) missing tools: ${tools_missing[*]} (needed on the GPU machine)"
    return
  fi
  [ "$st" = PASS ] && notes=("all present" "${notes[@]}")
  record "dependencies" "$st" $((SECONDS - t0)) "$(join_notes "${notes[@]}")"
}

# The CUDA libraries a bundle's binaries load (the GPU machine's own): the folders holding them,
# from the loader's cache, the toolkit beside nvcc, /usr/local/cuda*, and pip's nvidia packages.
cuda_lib_dirs() {
  local lib f d dirs=()
  for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
    f=$(ldconfig -p 2>/dev/null | awk -v l="$lib" '$1 == l {print $NF; exit}')
    if [ -z "$f" ]; then
      # shellcheck disable=SC2046  # one folder per word, on purpose
      f=$(find "$(dirname "${NVCC_DIR:-/nonexistent}")" /usr/local/cuda* /usr/lib/x86_64-linux-gnu \
            $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) \
            -name "$lib" -print -quit 2>/dev/null)
    fi
    [ -n "$f" ] || { echo "gpu-check: $lib not found on this machine" >&2; continue; }
    d=$(dirname "$f")
    case " ${dirs[*]} " in *" $d "*) ;; *) dirs+=("$d") ;; esac
  done
  (IFS=:; echo "${dirs[*]}")
}

# A bundle instead of a build: link its models where its tests look, put its libraries and the
# machine's CUDA libraries on the loader's path, and check it was built for this GPU.
step_bundle() {
  local t0=$SECONDS arch cuda notes=() st=PASS t
  say "== [4/8] prebuilt bundle ($PREBUILT)"
  if dry; then
    say "  ln -sfn $PREBUILT/shared $BUNDLE_SHARED; LD_LIBRARY_PATH=$PREBUILT/lib:<CUDA library folders>"
    return
  fi
  if [ ! -f "$PREBUILT/MANIFEST" ]; then
    record bundle FAIL 0 "$PREBUILT has no MANIFEST (make it with scripts/gpu-bundle.sh)"
    finish
  fi
  sed 's/^/  /' "$PREBUILT/MANIFEST" | tee -a "$LOG_FILE"
  mkdir -p "$(dirname "$BUNDLE_SHARED")" && ln -sfn "$PREBUILT/shared" "$BUNDLE_SHARED"
  cuda=$(cuda_lib_dirs)
  # The bundle's C++ runtime only where the machine's own is older than the binaries need: a newer
  # one serves them too, and the machine's tools may need it.
  local lib=$PREBUILT/lib cxx_need sys_cxx
  cxx_need=$(sed -n 's/^needs GLIBCXX >= //p' "$PREBUILT/MANIFEST")
  sys_cxx=$(ldconfig -p 2>/dev/null | awk '/libstdc\+\+\.so\.6 .*x86-64/ {print $NF; exit}')
  if [ -n "$sys_cxx" ] && [ -n "$cxx_need" ] && grep -qa "GLIBCXX_$cxx_need" "$sys_cxx"; then
    say "  C++ runtime: the machine's ($sys_cxx has GLIBCXX_$cxx_need)"
  else
    lib=$lib:$PREBUILT/lib/compat
    say "  C++ runtime: the bundle's (the machine's ${sys_cxx:-libstdc++ is not found} lacks GLIBCXX_${cxx_need:-?})"
  fi
  export LD_LIBRARY_PATH="$lib${cuda:+:$cuda}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  say "  LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  arch=$(sed -n 's/^arch sm_//p' "$PREBUILT/MANIFEST")
  case ";$ARCH;" in *";$arch;"*) ;; *) st=FAIL; notes+=("built for sm_$arch, this GPU is sm_$ARCH") ;; esac
  for t in "${GPU_TESTS[@]}"; do
    if [ ! -x "$BUILD/$t" ]; then st=FAIL; notes+=("$t missing"); continue; fi
    if ldd "$BUILD/$t" | grep -q 'not found'; then
      st=FAIL; notes+=("$t: $(ldd "$BUILD/$t" | grep 'not found' | awk '{print $1}' | tr '\n' ' ')not found")
    fi
  done
  BUILT=" ${GPU_TESTS[*]} "
  record bundle "$st" $((SECONDS - t0)) "$(join_notes "sm_$arch" "${notes[@]}")"
}

step_build() {
  local t0=$SECONDS lim t present=() absent=() cfg
  if [ -n "$PREBUILT" ]; then step_bundle; return; fi
  say "== [4/8] configure + build ($BUILD, sm ${ARCH:-?}, -j $JOBS)"
  cfg=(cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVSERVE_ENABLE_CUDA=ON
       -DKVSERVE_BUILD_TESTS=ON -DKVSERVE_BUILD_BENCH=ON "-DCMAKE_CUDA_ARCHITECTURES=$ARCH"
       "-DKVSERVE_SHARED_DIR=$SHARED")
  [ -n "$NVCC" ] && cfg+=("-DCMAKE_CUDA_COMPILER=$NVCC")
  if dry; then
    say "  configure (timeout ${T_CONFIGURE}s):"
    show_cmd "${cfg[@]}"
    say "  build (timeout ${T_BUILD}s; targets ninja does not know after configure are left out and fail):"
    show_cmd cmake --build "$BUILD" --parallel "$JOBS" --target "${GPU_TESTS[@]}" "${OTHER_TARGETS[@]}" -- -k 0
    return
  fi
  lim=$(limit_for "$T_CONFIGURE" 200)
  if [ "$lim" -eq 0 ]; then record configure FAIL 0 "no time left in the budget"; finish; fi
  run_timed "$lim" "$WORK/configure.log" "${cfg[@]}"
  if [ "$RC" -ne 0 ]; then
    record configure FAIL "$DUR" "cmake $(rc_note)"
    show_failure "configure" "$WORK/configure.log" 30
    finish
  fi
  # check_language(CUDA) quietly builds without CUDA when it cannot use nvcc: stop here, then.
  if ! grep -q 'kvserve: CUDA backend on' "$WORK/configure.log"; then
    record configure FAIL "$DUR" "CMake did not enable the CUDA backend (nvcc unusable?)"
    show_failure "configure (CUDA off)" "$WORK/configure.log" 30
    finish
  fi
  fact NCCL "$(grep -o 'kvserve: NCCL.*' "$WORK/configure.log" | head -n 1 | sed 's/^kvserve: //')"
  fact "built for" "CMAKE_CUDA_ARCHITECTURES=$ARCH, Release, $BUILD"
  record configure PASS "$DUR" "$(grep -o 'kvserve: CUDA backend on.*' "$WORK/configure.log" | head -n 1 | sed 's/^kvserve: //')"

  # Build what is there: a target missing from the tree is a failure of its own, not of the build.
  local known
  known=$(timeout 60 ninja -C "$BUILD" -t targets all 2>/dev/null)
  for t in "${GPU_TESTS[@]}" "${OTHER_TARGETS[@]}"; do
    # (Should ninja not list its targets, build them all and let the build say what is wrong.)
    if [ -z "$known" ] || grep -q "^$t: " <<< "$known"; then present+=("$t"); else absent+=("$t"); fi
  done
  [ "${#absent[@]}" -eq 0 ] || record "targets exist" FAIL 0 "not defined after configure: ${absent[*]}"
  # With no target named, cmake --build would build everything: stop instead.
  if [ "${#present[@]}" -eq 0 ]; then record build FAIL 0 "none of the targets exists"; finish; fi
  BUILT=" ${present[*]} "
  lim=$(limit_for "$T_BUILD" 30)
  if [ "$lim" -eq 0 ]; then record build FAIL 0 "no time left in the budget"; finish; fi
  say "  building ${present[*]} (timeout ${lim}s)"
  # -k 0: on an error ninja goes on with everything else, so the log shows every broken file at once.
  run_timed "$lim" "$WORK/build.log" cmake --build "$BUILD" --parallel "$JOBS" --target "${present[@]}" -- -k 0
  if [ "$RC" -ne 0 ]; then
    record build FAIL "$DUR" "$(rc_note); the run stops here"
    show_failure "build" "$WORK/build.log" 40
    finish
  fi
  record build PASS "$DUR" "${#present[@]} targets"
}
BUILT=''

# A bundle has no ctest files (their paths are the building machine's): run each test binary and
# write a log that reads like `ctest -V` ("N: <line>", then "N/M Test #N: name ... Passed"), so
# that the checks below apply unchanged.
run_bundle_tests() {
  local lim=$1 log=$2 i=0 n=${#GPU_TESTS[@]} t t0 out res worst=0 start=$SECONDS left
  : > "$log"
  for t in "${GPU_TESTS[@]}"; do
    i=$((i + 1)) t0=$SECONDS out=$WORK/test-$t.log
    left=$((start + lim - SECONDS))
    if [ "$left" -le 0 ]; then
      printf '%d/%d Test #%d: %s ....***Not Run 0.00 sec\n' "$i" "$n" "$i" "$t" >> "$log"
      worst=1
      continue
    fi
    KVSERVE_REQUIRE_GPU=1 KVSERVE_TEST_DEVICE=${KVSERVE_TEST_DEVICE:-cuda} \
      timeout -k 10 "$left" "$BUILD/$t" < /dev/null > "$out" 2>&1
    RC=$?
    sed "s/^/$i: /" "$out" >> "$log"
    if [ "$RC" -eq 0 ]; then res=Passed; elif [ "$RC" -eq 124 ]; then res="***Timeout"; else res="***Failed"; fi
    [ "$RC" -eq 0 ] || worst=$RC
    printf '%d/%d Test #%d: %s ....   %s %d.00 sec\n' "$i" "$n" "$i" "$t" "$res" $((SECONDS - t0)) >> "$log"
  done
  if [ "$worst" -eq 0 ]; then echo "100% tests passed" >> "$log"; else echo "some tests failed" >> "$log"; fi
  cat "$log" >> "$LOG_FILE"
  RC=$worst DUR=$((SECONDS - start))
}

# allowed_skips NUM LOG: how many of test NUM's skips are the two a GPU machine may show
# (tests/kernels/cuda/cuda_test_util.h): "needs N CUDA devices, M present" with N more than this
# machine's GPUs, and "runs on the CUDA simulator only". Any other skip fails the run.
allowed_skips() {
  local num=$1 log=$2 n=0 need
  while read -r need; do
    [ -n "$need" ] && [ "$need" -gt "$GPU_COUNT" ] && n=$((n + 1))
  done < <(grep -E "^$num: needs [0-9]+ CUDA devices, [0-9]+ present" "$log" |
           sed -E 's/.*needs ([0-9]+) CUDA devices.*/\1/')
  n=$((n + $(grep -cE "^$num: runs on the CUDA simulator only" "$log")))
  echo "$n"
}

step_ctest() {
  local t0=$SECONDS lim log=$WORK/ctest.log cmd t line res secs num skips all_skips summary st
  local allowed bad_skips=0
  say "== [5/8] ctest -L gpu (KVSERVE_REQUIRE_GPU=1 KVSERVE_TEST_DEVICE=cuda; a skip is a failure)"
  # -V: gtest prints its [  SKIPPED ] lines only there (a skipped gtest exits 0, ctest says Passed).
  cmd=(ctest --test-dir "$BUILD" -L gpu --output-on-failure -V --no-tests=error
       --output-junit "$REPORT_DIR/ctest-gpu.xml")
  if dry; then
    say "  (timeout ${T_CTEST}s) with KVSERVE_REQUIRE_GPU=1 KVSERVE_TEST_DEVICE=cuda KVSERVE_SHARED_DIR=$SHARED"
    if [ -n "$PREBUILT" ]; then
      say "  prebuilt: each of $BUILD/{${GPU_TESTS[*]}} in turn (no ctest files in a bundle)"
    else
      show_cmd "${cmd[@]}"
    fi
    say "  each of ${GPU_TESTS[*]} must show Passed; any [  SKIPPED ], ***Skipped or ***Not Run fails,"
    say "  except 'needs N CUDA devices' (N > this machine's GPUs) and 'runs on the CUDA simulator only'"
    return
  fi
  lim=$(limit_for "$T_CTEST" 60)
  if [ "$lim" -eq 0 ]; then record "ctest -L gpu" FAIL 0 "no time left in the budget"; return; fi
  if [ -n "$PREBUILT" ]; then
    run_bundle_tests "$lim" "$log"
  else
    run_timed "$lim" "$log" "${cmd[@]}"
  fi
  grep -E '^ *[0-9]+/[0-9]+ Test +#' "$log" | sed 's/^/  /' | tee -a "$LOG_FILE"
  for t in "${GPU_TESTS[@]}"; do
    line=$(grep -E "Test +#[0-9]+: $t( |$)" "$log" | tail -n 1)
    if [ -z "$line" ]; then
      case $BUILT in *" $t "*) res="did not run" ;; *) res="not built (no such target)" ;; esac
      record "test $t" FAIL 0 "$res"
      continue
    fi
    num=$(sed -E 's/.*Test +#([0-9]+):.*/\1/' <<< "$line")
    res=$(sed -E 's/.*Test +#[0-9]+: [^ ]+ [. ]*[*]*//; s/ +[0-9.]+ sec.*//' <<< "$line")
    secs=$(grep -oE '[0-9.]+ sec' <<< "$line" | cut -d' ' -f1)
    secs=${secs%.*}
    # The test's own output lines carry its number as a prefix in -V mode ("3: [  SKIPPED ] ...").
    skips=$(grep -E "^$num: " "$log" | grep -oE '\[  SKIPPED \] [A-Za-z_][^ ]*' | sort -u | wc -l)
    allowed=$(allowed_skips "$num" "$log")
    st=PASS
    [ "$res" = Passed ] || st=FAIL
    if [ "$skips" -gt "$allowed" ]; then
      st=FAIL; res="$res, $((skips - allowed)) test(s) skipped"
      bad_skips=$((bad_skips + skips - allowed))
    elif [ "$skips" -gt 0 ]; then
      res="$res ($skips left out: more GPUs needed, or simulator only)"
    fi
    record "test $t" "$st" "${secs:-0}" "$res"
  done
  # Skips beyond the allowed ones (counted per test above, each skipped test once: gtest names
  # it twice, in its run and in its summary) and tests ctest did not run.
  all_skips=$((bad_skips + $(grep -cE '\*\*\*Skipped|\*\*\*Not Run|\((Skipped|Disabled)\)' "$log")))
  summary=$(grep -E 'tests passed|No tests were found' "$log" | tail -n 1)
  st=PASS
  if [ "$RC" -ne 0 ] || [ "$all_skips" -gt 0 ]; then st=FAIL; fi
  record "ctest -L gpu" "$st" "$DUR" "${summary:-no summary} ($(rc_note); skip/not-run lines: $all_skips)"
  [ "$st" = PASS ] || show_failure "ctest -L gpu" "$log" 40
}

# Prints the token ids of the "token_ids" field of kvserve's JSON (comma-separated), with grep and
# sed rather than python3, which a bare machine may lack. The leading quote keeps
# "prompt_token_ids" out.
token_ids() {
  grep -oE '"token_ids" *: *\[[^]]*\]' "$1" | head -n 1 | sed -E 's/.*\[//; s/\].*//; s/[[:space:]]//g'
}

step_e2e() {
  local model=$SHARED/$E2E_MODEL bin lim i label ids n d first_bad ref='' all_same=1 args
  local -a variants=("--device cpu" "--device cuda" "--device cuda --enforce-eager") outs=()
  say "== [6/8] end to end: kvserve generate, cpu vs cuda (graphs) vs cuda --enforce-eager"
  if [ -n "$PREBUILT" ]; then
    # kvserve and its gRPC libraries would not fit the carry limit beside the tests.
    say "  prebuilt bundle: no kvserve binary; cuda_engine_test ran the engine end to end"
    dry || record "end to end (kvserve generate)" SKIP 0 "not in the bundle; cuda_engine_test covers it"
    return
  fi
  args=(generate --model "$model" --prompt "$E2E_PROMPT" --temperature 0 --max-tokens "$E2E_TOKENS"
        --ignore-eos --json --keep-f32-weights)
  if dry; then
    for label in "${variants[@]}"; do
      # shellcheck disable=SC2086  # the variant is a list of flags, split on purpose
      show_cmd "$BUILD/kvserve" "${args[@]}" $label
    done
    say "  (timeout ${T_GENERATE}s each) the three \"token_ids\" lists ($E2E_TOKENS ids) must be identical"
    return
  fi
  bin=$BUILD/kvserve
  [ -x "$bin" ] || bin=$(find_bin kvserve)
  if [ -z "$bin" ]; then record "generate (all devices)" FAIL 0 "kvserve binary not built"; return; fi
  for i in "${!variants[@]}"; do
    label=${variants[i]}
    lim=$(limit_for "$T_GENERATE" 30)
    if [ "$lim" -eq 0 ]; then record "generate $label" FAIL 0 "no time left in the budget"; outs+=(""); continue; fi
    # shellcheck disable=SC2086  # the variant is a list of flags, split on purpose
    run_timed "$lim" "$WORK/e2e-$i.log" "$bin" "${args[@]}" $label
    ids=$(token_ids "$WORK/e2e-$i.log")
    n=0; [ -n "$ids" ] && n=$(tr ',' '\n' <<< "$ids" | grep -c .)
    outs+=("$ids")
    if [ "$RC" -eq 0 ] && [ "$n" -eq "$E2E_TOKENS" ]; then
      record "generate $label" PASS "$DUR" "$n tokens"
    else
      record "generate $label" FAIL "$DUR" "$(rc_note), $n token ids (want $E2E_TOKENS)"
      show_failure "generate $label" "$WORK/e2e-$i.log" 15
    fi
  done
  ref=${outs[0]}
  for i in 1 2; do
    if [ -z "$ref" ] || [ "${outs[i]}" != "$ref" ]; then all_same=0; fi
  done
  {
    echo "### kvserve generate token ids"; echo; echo '```'
    for i in "${!variants[@]}"; do printf '%-30s %s\n' "${variants[i]}:" "${outs[i]:-(none)}"; done
    echo '```'; echo
  } | detail
  if [ "$all_same" = 1 ]; then
    record "generate: cpu = cuda = cuda eager" PASS 0 "$E2E_TOKENS greedy tokens identical"
  else
    # Where the lists part ways: the first index that differs from the CPU's.
    d=''
    for i in 1 2; do
      first_bad=$(paste -d' ' <(tr ',' '\n' <<< "$ref") <(tr ',' '\n' <<< "${outs[i]}") |
                  awk '$1 != $2 { print NR - 1; exit }')
      d="${d:+$d; }${variants[i]#--device } at ${first_bad:-none}"
    done
    record "generate: cpu = cuda = cuda eager" FAIL 0 "first token index differing from cpu: $d"
    for i in "${!variants[@]}"; do say "      ${variants[i]}: ${outs[i]:-(none)}"; done
  fi
}

step_bench() {
  local bin lim cap log=$WORK/bench.log args=() row name value ratio verdict got cols i
  local missed=() met=0
  local mode=default
  say "== [7/8] kernel benchmark (cuda_kernels_bench)"
  # A plain program that prints one markdown table (bench/cuda_kernels_bench.cc, docs/gpu.md):
  # | case | time | achieved | of peak | bound | target | verdict |. By default it measures the
  # target points (about a minute); --grid the whole grid.
  cap=$T_BENCH
  if [ "$BENCH_GRID" = 1 ]; then args=(--grid) mode=grid cap=$T_BENCH_GRID; fi
  if dry; then
    say "  (timeout ${cap}s; the $mode run, one markdown table) while nvidia-smi samples the" \
      "clocks every 250 ms"
    bin=$(find_bin cuda_kernels_bench)
    show_cmd "${bin:-$BUILD/bench/cuda_kernels_bench}" "${args[@]}"
    say "  a missed target (docs/gpu.md) is recorded as a warning, not a failure"
    return
  fi
  bin=$(find_bin cuda_kernels_bench)
  if [ -z "$bin" ]; then record "cuda_kernels_bench" FAIL 0 "not built"; return; fi
  lim=$(limit_for "$cap")
  if [ "$lim" -eq 0 ]; then record "cuda_kernels_bench" FAIL 0 "no time left in the budget"; return; fi
  # Clocks at idle say little: sample them while the benchmark runs (a throttled GPU shows here).
  if [ -n "$SMI" ]; then
    timeout $((lim + 15)) "$SMI" --query-gpu=index,clocks.sm,clocks.mem,power.draw,temperature.gpu \
      --format=csv,noheader,nounits -lms 250 > "$WORK/bench-clocks.csv" 2>/dev/null &
    SAMPLER=$!
  fi
  run_timed "$lim" "$log" "$bin" "${args[@]}"
  if [ -n "$SAMPLER" ]; then
    kill "$SAMPLER" 2>/dev/null
    wait "$SAMPLER" 2>/dev/null
    SAMPLER=''
    fact "GPU 0 under the benchmark" "$(awk -F', *' '$1 == 0 && $2 + 0 > 0 {
        if ($2 > sm) sm = $2; if ($3 > mc) mc = $3; if ($4 > pw) pw = $4; if ($5 > tc) tc = $5 }
      END { if (sm) printf "SM up to %d MHz, memory %d MHz, up to %.0f W, %d C", sm, mc, pw, tc;
            else printf "no samples" }' "$WORK/bench-clocks.csv")"
  fi
  sed 's/^/  /' "$log" | grep -v '^  \$ ' | tee -a "$LOG_FILE" > /dev/null
  {
    echo "### cuda_kernels_bench ($mode run)"; echo
    grep -v -e '^\$ ' -e '^# ' "$log"; echo
  } | detail
  # The summary keeps the bandwidth references and the rows with a target; the whole table is in the
  # details. Columns: case | time | achieved | of peak | bound | target | verdict.
  local n=0
  while IFS= read -r row; do
    row=${row#| } row=${row% |}
    IFS='|' read -r -a cols <<< "$row"
    for i in "${!cols[@]}"; do cols[i]=$(trim "${cols[i]}"); done
    [ "${#cols[@]}" -ge 7 ] || continue
    n=$((n + 1))
    name=${cols[0]} value="${cols[1]}, ${cols[2]}" ratio=${cols[3]} verdict=${cols[6]}
    case $verdict in
      met) met=$((met + 1)) ;;
      MISSED*) got=${verdict#MISSED (} && missed+=("$name: ${got%)} < ${cols[5]#>= }") ;;
    esac
    case $name in
      *"bandwidth reference"*) ratio="a bandwidth reference (measured; the faster is the peak)" ;;
      *) [ "${cols[5]}" = - ] && continue; ratio="$ratio; target ${cols[5]}: $verdict" ;;
    esac
    BENCH_NAME+=("$name") BENCH_VALUE+=("$value") BENCH_RATIO+=("$ratio")
  done < <(grep -E '^\| ' "$log" | grep -vE '^\|[- |]*$|^\| case \|')
  for i in "${!BENCH_NAME[@]}"; do say "  ${BENCH_NAME[i]}: ${BENCH_VALUE[i]} [${BENCH_RATIO[i]}]"; done
  if [ "$RC" -eq 0 ] && [ "$n" -gt 0 ]; then
    record "cuda_kernels_bench ($mode)" PASS "$DUR" "$n measurements"
  else
    record "cuda_kernels_bench ($mode)" FAIL "$DUR" "$(rc_note), $n measurements read"
    show_failure "cuda_kernels_bench" "$log" 15
  fi
  # The targets are what the kernels being written are held to: a miss is a warning.
  if [ "${#missed[@]}" -gt 0 ]; then
    local shown=("${missed[@]:0:8}")
    [ "${#missed[@]}" -gt 8 ] && shown+=("and $((${#missed[@]} - 8)) more (see the table)")
    record "kernel targets (docs/gpu.md)" WARN 0 \
      "$met met, ${#missed[@]} missed: $(join_notes "${shown[@]}")"
  elif [ "$met" -gt 0 ]; then
    record "kernel targets (docs/gpu.md)" PASS 0 "all $met met"
  fi
}

step_sanitizers() {
  local san tool bin lim log name ran st note ops att n=0
  say "== [8/8] compute-sanitizer (${SANITIZER_TOOLS[*]}) on cuda_ops_test and a small cuda_attention_test"
  if [ "$SANITIZE" = 0 ]; then
    if dry; then say "  --no-sanitizers: left out"; else record "compute-sanitizer" SKIP 0 "--no-sanitizers"; fi
    return
  fi
  san=$(find_sanitizer)
  if dry; then
    say "  compute-sanitizer: ${san:-not found here (looked in \$CUDA_HOME/bin, beside nvcc, \$CUDA_HOME/compute-sanitizer); a real run fails without it}"
    say "  with OPS=\$(find $BUILD -name cuda_ops_test -type f -executable), ATT likewise:"
    for tool in "${SANITIZER_TOOLS[@]}"; do
      show_cmd "${san:-compute-sanitizer}" --tool "$tool" --error-exitcode 1 "\$OPS"
      show_cmd env KVSERVE_TEST_SMALL=1 "${san:-compute-sanitizer}" --tool "$tool" --error-exitcode 1 \
        "\$ATT" "--gtest_filter=$ATTENTION_FILTER"
    done
    say "  (timeout ${T_SANITIZER}s each, cut to what is left of the budget)"
    return
  fi
  if [ -z "$san" ]; then
    record "compute-sanitizer" FAIL 0 "not found (\$CUDA_HOME/bin, beside nvcc, \$CUDA_HOME/compute-sanitizer)"
    return
  fi
  say "  $san"
  ops=$(find_bin cuda_ops_test) att=$(find_bin cuda_attention_test)
  # memcheck on both first: it finds the most; racecheck and synccheck get what is left.
  for tool in "${SANITIZER_TOOLS[@]}"; do
    for name in cuda_ops_test cuda_attention_test; do
      n=$((n + 1))
      log=$WORK/sanitizer-$n.log
      bin=$ops; [ "$name" = cuda_attention_test ] && bin=$att
      if [ -z "$bin" ]; then record "$tool $name" FAIL 0 "test binary not built"; continue; fi
      lim=$(limit_for "$T_SANITIZER")
      if [ "$lim" -eq 0 ]; then record "$tool $name" FAIL 0 "no time left in the budget"; continue; fi
      if [ "$name" = cuda_attention_test ]; then
        run_timed "$lim" "$log" env KVSERVE_TEST_SMALL=1 "$san" --tool "$tool" --error-exitcode 1 \
          "$bin" "--gtest_filter=$ATTENTION_FILTER"
      else
        run_timed "$lim" "$log" "$san" --tool "$tool" --error-exitcode 1 "$bin"
      fi
      # A run that tested nothing (every test skipped, or a filter that matched none) proves nothing.
      ran=$(grep -oE '\[  PASSED  \] [0-9]+ test' "$log" | grep -oE '[0-9]+' | tail -n 1)
      note="$(rc_note), $(grep -oE '(ERROR|RACECHECK|SYNCCHECK) SUMMARY: .*' "$log" | tail -n 1 | sed 's/=//g')"
      st=PASS
      if [ "$RC" -ne 0 ]; then st=FAIL; fi
      # Hazards that racecheck reports only inside NVIDIA's own kernels (cuBLAS's nvjet split-K
      # GEMMs on Hopper: seen on an H200) are not kvserve's to mend: a warning, named.
      if [ "$tool" = racecheck ] && [ "$RC" -ne 0 ] && grep -q 'Race reported' "$log" &&
         ! grep -q '^\[  FAILED  \]' "$log" &&
         ! grep -E 'Race reported|and (Read|Write) access at' "$log" | grep -q 'kvserve'; then
        st=WARN
        note="$note; only in NVIDIA's kernels: $(grep -oE 'at [A-Za-z_][A-Za-z0-9_]*' "$log" |
          sort -u | head -n 3 | cut -c4- | tr '\n' ' ')"
      fi
      # A skip is a failure, but for the ones a GPU run may show (the simulator-only tests, tests
      # that need more GPUs): the same rule as the ctest step.
      local skipped allowed_here
      skipped=$(grep -cE '^\[  SKIPPED \] [A-Za-z_][^ ]* \(' "$log")
      allowed_here=$(grep -cE '^runs on the CUDA simulator only|^needs [0-9]+ CUDA devices' "$log")
      if [ "$skipped" -gt "$allowed_here" ]; then st=FAIL; note="$note, tests skipped"; fi
      if [ "$RC" -eq 0 ] && [ "${ran:-0}" -eq 0 ]; then st=FAIL; note="$note, no test passed"; fi
      record "$tool $name" "$st" "$DUR" "$note"
      [ "$st" = PASS ] || show_failure "compute-sanitizer $tool $name" "$log" 20
    done
  done
}

# ---- The run ----

mapfile -t PKGS < <(read_packages)
resolve_shared
if ! dry; then
  mkdir -p "$REPORT_DIR" || exit 2
  LOG_FILE=$REPORT_DIR/gpu-check.log
  : > "$LOG_FILE"
  : > "$DETAILS"
  rm -f "$REPORT_DIR/ctest-gpu.xml" "$REPORT_DIR/cuda-kernels-bench.json"
fi
if dry; then
  say "gpu-check --dry-run: the plan (nothing is built or run); budget ${BUDGET}s"
else
  say "gpu-check: commit $COMMIT, budget ${BUDGET}s, report in $REPORT_DIR"
fi
fact "shared data" "$SHARED ($SHARED_FROM)"
command -v timeout > /dev/null || { echo "gpu-check: needs coreutils timeout" >&2; exit 2; }

step_facts
step_consistency
step_deps
# From here on every process sees the shared data and the tests' GPU switches.
export KVSERVE_SHARED_DIR=$SHARED KVSERVE_REQUIRE_GPU=1 KVSERVE_TEST_DEVICE=cuda
step_build
step_ctest
step_e2e
step_bench
step_sanitizers
finish
