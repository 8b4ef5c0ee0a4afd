#!/usr/bin/env bash
# Drives kvserve's OpenAI-compatible HTTP front with the official `openai` npm client:
#   1. installs the pinned client (package-lock.json) with `npm ci` into a cache keyed by the
#      manifest and lock, under $KVSERVE_NPM_CACHE (default ~/.cache/kvserve-npm), as
#      scripts/check-helm.sh does, so that reruns need no network;
#   2. builds a fixture model: MODEL_DIR's files, linked, with a tokenizer_config.json that adds
#      Qwen2.5's chat template (Hermes-style tool calls) to the original, because
#      stories260K-hf has no chat template of its own, and a config.json with a longer context;
#   3. starts `kvserve up` with one worker on free loopback ports and waits for /health;
#   4. runs openai_client_test.mjs (node:test) against http://127.0.0.1:PORT/v1.
#
#   run.sh --kvserve PATH --model-dir DIR [-- NODE_TEST_ARGS...]
#     e.g. -- --test-name-pattern='logprobs' runs some of the cases only.
#
# Exit status: 0 passed; 1 failed; 77 (ctest: Skipped) when node/npm are missing or the client
# cannot be installed, except in CI, where that is a failure (tests/test_util/ci_skip.sh): CI
# installs node and npm (scripts/install-deps.sh), so there is no declared reason to skip.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
name=openai_npm_client_test
# The template added to the fixture: a released Hermes-style one with tool support.
template_config=qwen2.5-coder-3b-instruct/tokenizer_config.json
startup_timeout_s=60

# shellcheck source=tests/test_util/ci_skip.sh
source "$root/tests/test_util/ci_skip.sh"
say() { echo "$name: $*"; }
fail() { echo "$name: FAIL: $*" >&2; exit 1; }
# skip MESSAGE: exits 77 where a skip is allowed, 1 in CI.
skip() {
  ci_skip "$name" "$1" && exit 77
  exit 1
}

kvserve=""
model_dir=""
node_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --kvserve) kvserve=${2:?--kvserve needs a path}; shift 2 ;;
    --model-dir) model_dir=${2:?--model-dir needs a directory}; shift 2 ;;
    --) shift; node_args=("$@"); break ;;
    *) echo "usage: $0 --kvserve PATH --model-dir DIR [-- NODE_TEST_ARGS...]" >&2; exit 2 ;;
  esac
done
if [ -z "$kvserve" ] || [ -z "$model_dir" ]; then
  echo "usage: $0 --kvserve PATH --model-dir DIR [-- NODE_TEST_ARGS...]" >&2
  exit 2
fi
[ -x "$kvserve" ] || fail "no kvserve binary at $kvserve"
[ -f "$model_dir/config.json" ] || fail "no model at $model_dir (config.json missing)"
model_dir=$(cd "$model_dir" && pwd)
# ../shared/models/chat_templates, beside the model directory.
templates=$(dirname "$model_dir")/chat_templates
[ -f "$templates/$template_config" ] || fail "no chat template at $templates/$template_config"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  skip "node/npm not installed (scripts/install-deps.sh installs Debian's nodejs, npm)"
fi
node_major=$(node -p 'process.versions.node.split(".")[0]')
[ "$node_major" -ge 18 ] || skip "node $(node --version) is too old: the test needs node 18+"

work=$(mktemp -d "${TMPDIR:-/tmp}/kvserve-openai-npm.XXXXXX")
cluster_pid=""
# Stops the cluster: SIGTERM lets `kvserve up` stop its router and workers; whatever is left of
# its process group after 30 s (its own session, see below) is killed.
stop_cluster() {
  [ -n "$cluster_pid" ] || return 0
  kill -TERM "$cluster_pid" 2>/dev/null || true
  local waited=0
  while kill -0 "$cluster_pid" 2>/dev/null && [ $waited -lt 300 ]; do
    sleep 0.1
    waited=$((waited + 1))
  done
  kill -KILL -- "-$cluster_pid" 2>/dev/null || true
  wait "$cluster_pid" 2>/dev/null || true
  cluster_pid=""
}
cleanup() {
  stop_cluster
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- the client, from the committed lock -----------------------------------------------------
cache=${KVSERVE_NPM_CACHE:-$HOME/.cache/kvserve-npm}
key=$(cat "$here/package.json" "$here/package-lock.json" | sha256sum | cut -c1-16)
deps="$cache/openai-npm-$key"
npm_flags=(--cache "$cache/npm" --prefer-offline --no-audit --no-fund --loglevel=error
  --fetch-retries=1 --fetch-timeout=30000)
if [ ! -f "$deps/.installed" ]; then
  mkdir -p "$cache"
  staging="$deps.tmp.$$"
  rm -rf "$staging" && mkdir -p "$staging"
  cp "$here/package.json" "$here/package-lock.json" "$staging/"
  if ! (cd "$staging" && timeout 180 npm ci "${npm_flags[@]}" >"$work/npm-ci.log" 2>&1); then
    rm -rf "$staging"
    skip "npm ci failed: $(grep -v 'complete log' "$work/npm-ci.log" | head -n 3 | tr '\n' ' ')"
  fi
  touch "$staging/.installed"
  # Another run may have installed the same key meanwhile: either copy will do.
  if [ ! -f "$deps/.installed" ]; then
    rm -rf "$deps" && mv "$staging" "$deps"
  else
    rm -rf "$staging"
  fi
fi
# The test runs from the scratch directory: node resolves `openai` and `ajv` from the
# node_modules beside it (a copy of the script, not a link, which node would resolve back here).
cp "$here/openai_client_test.mjs" "$work/"
ln -s "$deps/node_modules" "$work/node_modules"
openai_version=$(node -p "require('$deps/node_modules/openai/package.json').version")
say "node $(node --version), openai $openai_version; $work/openai_client_test.mjs is a copy" \
  "of $here/openai_client_test.mjs"

# --- the fixture model: MODEL_DIR plus a chat template, with a longer context -------------------
# stories260K's context (512 tokens) cannot hold Qwen2.5's tool preamble (about 620 tokens with
# two small tools; its tokenizer has 512 pieces), so the fixture raises max_position_embeddings
# to 2048. Rotary positions past 512 are untrained, which only makes the nonsense text more so;
# prompts without tools stay under 512 tokens and are unaffected.
context=2048
model="$work/model"
mkdir -p "$model"
for file in "$model_dir"/*; do
  case "$(basename "$file")" in
    tokenizer_config.json | config.json) ;;
    *) ln -s "$file" "$model/" ;;
  esac
done
node -e '
  const fs = require("fs");
  const [modelDir, donor, out, context] = process.argv.slice(1);
  const read = (path) => JSON.parse(fs.readFileSync(path, "utf8"));
  const write = (path, value) => fs.writeFileSync(path, JSON.stringify(value, null, 2) + "\n");
  const tokenizerConfig = fs.existsSync(modelDir + "/tokenizer_config.json")
    ? read(modelDir + "/tokenizer_config.json") : {};
  tokenizerConfig.chat_template = read(donor).chat_template;
  if (typeof tokenizerConfig.chat_template !== "string") {
    throw new Error(donor + ": no chat_template");
  }
  tokenizerConfig.model_max_length = Number(context);
  write(out + "/tokenizer_config.json", tokenizerConfig);
  const config = read(modelDir + "/config.json");
  config.max_position_embeddings = Number(context);
  write(out + "/config.json", config);
' "$model_dir" "$templates/$template_config" "$model" "$context"
# The template must render here, tools included, before a server is started on it.
cat >"$work/render-check.json" <<'EOF'
{"add_generation_prompt": true,
 "tools": [{"type": "function", "function": {"name": "get_time", "parameters":
   {"type": "object", "properties": {"timezone": {"type": "string"}}}}}],
 "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}
EOF
if ! "$kvserve" chat-template --config "$model" --request "$work/render-check.json" \
    >"$work/rendered.txt" 2>&1; then
  fail "the fixture's chat template does not render: $(cat "$work/rendered.txt")"
fi
grep -q '<tools>' "$work/rendered.txt" ||
  fail "the rendered prompt lacks the tools: $(cat "$work/rendered.txt")"

# --- the cluster -------------------------------------------------------------------------------
# Port 0 everywhere: the router and the HTTP front print the ports they got. setsid: the cluster
# gets a process group of its own, so that nothing of it outlives this script (stop_cluster); a
# script's background job leads no group, so setsid execs in place and $! is kvserve's pid.
log="$work/up.log"
# Created here: the background job opens it only once it runs, and a sed on a missing file fails
# the pipeline below, which set -e -o pipefail turns into a silent exit (seen in CI).
: >"$log"
setsid "$kvserve" up --model "$model" --workers 1 --listen 127.0.0.1:0 \
  --http-listen 127.0.0.1:0 --startup-timeout "$startup_timeout_s" >"$log" 2>&1 &
cluster_pid=$!
show_log() { echo "--- kvserve up log ---" >&2; cat "$log" >&2; echo "---" >&2; }

deadline=$((SECONDS + startup_timeout_s))
base_url=""
while [ -z "$base_url" ]; do
  base_url=$(sed -n 's#^kvserve up: OpenAI API on \(http://[^ ]*/v1\).*#\1#p' "$log" | head -n 1)
  [ -n "$base_url" ] && break
  kill -0 "$cluster_pid" 2>/dev/null || { show_log; fail "kvserve up exited before serving"; }
  if [ $SECONDS -ge $deadline ]; then
    show_log
    fail "kvserve up not serving after ${startup_timeout_s} s"
  fi
  sleep 0.2
done
health="${base_url%/v1}/health"
# Bounded by the same deadline: /health answers 200 once the router has a ready worker.
if ! node -e '
  const [url, deadline] = [process.argv[1], Date.now() + Number(process.argv[2]) * 1000];
  (async () => {
    for (;;) {
      try {
        const res = await fetch(url, { signal: AbortSignal.timeout(5000) });
        if (res.status === 200) return;
      } catch {}
      if (Date.now() > deadline) process.exit(1);
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
  })();
' "$health" "$((deadline - SECONDS > 1 ? deadline - SECONDS : 1))"; then
  show_log
  fail "$health did not answer 200 within ${startup_timeout_s} s"
fi
say "cluster up: $base_url"

# --- the tests ---------------------------------------------------------------------------------
status=0
KVSERVE_OPENAI_BASE_URL=$base_url node --test --test-reporter=spec "${node_args[@]}" \
  "$work/openai_client_test.mjs" || status=$?
if [ $status -ne 0 ]; then
  show_log
  fail "openai client tests failed (node exit status $status)"
fi
stop_cluster
say "passed"
