// Engine overhead: scheduling, sampling, detokenization and bookkeeping around the model.
//
//   build-*/bench/engine_bench --benchmark_counters_tabular=true
//
// BM_EngineDecodeStep times Engine::StepOnce (manual mode, run_loop_thread = false) while `batch`
// requests decode together; BM_ModelDecodeStep times LlamaModel::Forward alone on the same batch
// shape (same model, same thread count, same contexts). overhead_% = 1 - forward / step, both
// timed inside the engine over the same steps (EngineStats::step_seconds, forward_seconds). The model is a synthetic Llama
// (4 layers, hidden 512, FFN 1408, bf16) with the GPT-2 vocabulary (50257 ids) and tokenizer, so
// that sampling and detokenization work over a realistic vocabulary.

#include <benchmark/benchmark.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "bench/decode_harness.h"
#include "bench/gpt2_vocab_model.h"
#include "common/tokenizer_loader/tokenizer_loader.h"
#include "kernels/cpu/thread_pool.h"
#include "worker/engine/engine.h"
#include "worker/model/loaded_model.h"
#include "worker/model/synthetic_model.h"

namespace kvserve {
namespace {

constexpr int kPromptLen = 32;
// Enough decode steps for every timed iteration (a step of batch 1 takes > 5 ms here).
constexpr int kMaxTokens = 480;

const LoadedModel* Model() { return Gpt2VocabModel(); }

// Args: batch, greedy (1) or temperature 1 sampling (0).
void BM_EngineDecodeStep(benchmark::State& state) {
  const LoadedModel* model = Model();
  if (model == nullptr) {
    state.SkipWithError("gpt2 tokenizer not found");
    return;
  }
  const int batch = static_cast<int>(state.range(0));
  EngineOptions o;
  o.run_loop_thread = false;
  // Room for every request's whole length (prompt + max_tokens) at once: no preemption.
  o.num_kv_blocks = int64_t{batch} * ((kPromptLen + kMaxTokens) / 16 + 2) + 1;
  o.scheduler.max_num_seqs = batch;
  o.scheduler.max_num_batched_tokens = batch * kPromptLen;
  std::unique_ptr<Engine> engine = *Engine::Create(model, o);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int s = 0; s < batch; ++s) {
    EngineRequest r;
    r.request_id = std::to_string(s);  // ("r" + ... trips a g++ 12 -Wrestrict false positive)
    for (int j = 0; j < kPromptLen; ++j) r.prompt_ids.push_back((s * 131 + j * 17) % 50000);
    r.params.max_tokens = kMaxTokens;
    r.params.ignore_eos = true;
    r.params.temperature = state.range(1) != 0 ? 0.0f : 1.0f;
    r.params.seed = s;
    streams.push_back(*engine->Submit(std::move(r)));
  }
  RequestOutput out;
  const auto drain = [&] {
    for (auto& s : streams) {
      while (s->TryNext(&out)) {
      }
    }
  };
  // Prefill (one step), then a few decode steps.
  for (int i = 0; i < 4; ++i) {
    engine->StepOnce();
    drain();
  }
  const EngineStats before = engine->stats();
  for (auto _ : state) {
    engine->StepOnce();
    drain();
  }
  const EngineStats after = engine->stats();
  // Measured inside the engine on the same steps: the step's wall time against the part spent
  // in LlamaModel::Forward (robust to the machine's drift between benchmarks).
  const double step = after.step_seconds - before.step_seconds;
  const double forward = after.forward_seconds - before.forward_seconds;
  state.counters["overhead_%"] = step > 0 ? 100.0 * (1.0 - forward / step) : 0.0;
  state.counters["running"] = engine->stats().num_running;
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(state.iterations()) * batch,
                                               benchmark::Counter::kIsRate);
}
BENCHMARK(BM_EngineDecodeStep)
    ->ArgNames({"batch", "greedy"})
    ->ArgsProduct({{1, 64}, {1, 0}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// Constrained decoding's cost per step: `batch` requests decoding together on stories260K, each
// constrained by a JSON schema of nested objects, arrays, enums and numbers (or, with
// constrained = 0, unconstrained), sampled at temperature 1. A request that finishes is replaced
// at once, so the batch stays full. mask_% = constraint time (token masks and parser advances,
// EngineStats::constraint_seconds) over the rest of the step: what constrained decoding adds.
// The masks are cached per parser state across requests, as in serving.
void BM_ConstrainedDecodeStep(benchmark::State& state) {
  static const LoadedModel* stories = [] {
    absl::StatusOr<LoadedModel> m =
        LoadModel(KVSERVE_SHARED_DIR "/models/stories260K/stories260K.gguf");
    return m.ok() ? new LoadedModel(*std::move(m)) : nullptr;
  }();
  if (stories == nullptr) {
    state.SkipWithError("stories260K not found");
    return;
  }
  static constexpr const char* kSchema = R"({"type": "object", "properties": {
      "title": {"type": "string", "maxLength": 16},
      "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
      "rating": {"type": "number", "minimum": 0, "maximum": 10},
      "genre": {"enum": ["drama", "comedy", "horror", "documentary"]},
      "cast": {"type": "array", "minItems": 1, "maxItems": 3, "items": {"type": "object",
               "properties": {"name": {"type": "string", "maxLength": 12},
                              "lead": {"type": "boolean"}}, "required": ["name", "lead"]}}},
      "required": ["title", "year", "genre", "cast"]})";
  const int batch = static_cast<int>(state.range(0));
  const bool constrained = state.range(1) != 0;
  EngineOptions o;
  o.run_loop_thread = false;
  o.num_threads = 1;
  o.scheduler.max_num_seqs = batch;
  std::unique_ptr<Engine> engine = *Engine::Create(stories, o);
  const std::vector<TokenId> prompt = *stories->tokenizer->Encode("Once upon a time");
  int next_id = 0;
  auto submit = [&] {
    EngineRequest r;
    r.request_id = std::to_string(next_id);
    r.prompt_ids = prompt;
    r.params.max_tokens = 200;
    r.params.seed = next_id++;
    if (constrained) r.constraint = {constraint::ConstraintSpec::Kind::kJsonSchema, kSchema};
    return *engine->Submit(std::move(r));
  };
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int s = 0; s < batch; ++s) streams.push_back(submit());
  RequestOutput out;
  const auto step = [&] {
    engine->StepOnce();
    for (auto& s : streams) {
      bool done = false;
      while (s->TryNext(&out)) done = done || (out.finished && out.sample_index == 0);
      if (done) s = submit();
    }
  };
  for (int i = 0; i < 8; ++i) step();
  const EngineStats before = engine->stats();
  for (auto _ : state) step();
  const EngineStats after = engine->stats();
  const double step_s = after.step_seconds - before.step_seconds;
  const double mask_s = after.constraint_seconds - before.constraint_seconds;
  state.counters["mask_%"] = step_s > mask_s ? 100.0 * mask_s / (step_s - mask_s) : 0.0;
  state.counters["running"] = after.num_running;
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(state.iterations()) * batch,
                                               benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ConstrainedDecodeStep)
    ->ArgNames({"batch", "constrained"})
    ->ArgsProduct({{32}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// The prefix cache's tiers on a shared-prefix workload whose prefixes need 4 times the device
// pool: 16 "system prompts" of 256 tokens (16 blocks each, 256 blocks in all) over a device pool
// of 64 blocks, asked in two rounds, one request after another (chat turns), each with its own
// 16-token question and 4 generated tokens. Arg tiers: 0 none, 1 host memory, 2 disk alone (a
// fresh directory). Counters: hit_% (prompt tokens served from the prefix cache, any tier),
// restored_% (part of the prompt tokens restored from a tier), req/s, ttft_ms (mean time from
// Submit to the first token) and ttft2_ms (the same over the second round, whose prefixes the
// device pool has dropped by then).
void BM_SharedPrefixTiers(benchmark::State& state) {
  const LoadedModel* model = Model();
  if (model == nullptr) {
    state.SkipWithError("gpt2 tokenizer not found");
    return;
  }
  constexpr int kPrefixes = 16;
  constexpr int kPrefixLen = 256;
  const int tiers = static_cast<int>(state.range(0));
  std::vector<EngineRequest> requests;
  for (int round = 0; round < 2; ++round) {
    for (int p = 0; p < kPrefixes; ++p) {
      EngineRequest r;
      r.request_id = std::to_string(round * kPrefixes + p);
      for (int j = 0; j < kPrefixLen; ++j) r.prompt_ids.push_back((p * 7919 + j * 131) % 50000);
      for (int j = 0; j < 16; ++j) r.prompt_ids.push_back((round * 977 + p * 31 + j) % 50000);
      r.params.max_tokens = 4;
      r.params.ignore_eos = true;
      r.params.temperature = 0;
      requests.push_back(std::move(r));
    }
  }
  std::string dir;
  double ttft_sum = 0;
  double ttft2_sum = 0;
  EngineStats last;
  for (auto _ : state) {
    EngineOptions o;
    o.num_kv_blocks = 65;
    o.block_size = 16;
    o.kv_cache_dtype = KvCacheDType::kBF16;
    if (tiers == 1) o.kv_offload.host_bytes = int64_t{1} << 30;
    if (tiers == 2) {
      char tmpl[] = "/tmp/kvserve-bench-tiers-XXXXXX";
      dir = mkdtemp(tmpl) != nullptr ? tmpl : "";
      o.kv_offload.disk_dir = dir;
      o.kv_offload.disk_bytes = int64_t{1} << 30;
    }
    std::unique_ptr<Engine> engine = *Engine::Create(model, o);
    for (size_t i = 0; i < requests.size(); ++i) {
      const EngineRequest& r = requests[i];
      const auto start = std::chrono::steady_clock::now();
      std::shared_ptr<RequestStream> s = *engine->Submit(r);
      RequestOutput out;
      bool first = true;
      while (s->Next(&out)) {
        if (first && !out.token_ids.empty()) {
          const double ttft =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          ttft_sum += ttft;
          if (i >= kPrefixes) ttft2_sum += ttft;
          first = false;
        }
      }
    }
    last = engine->stats();
    engine.reset();
    if (!dir.empty()) std::filesystem::remove_all(dir);
  }
  const double queries = static_cast<double>(last.prefix_query_tokens);
  state.counters["hit_%"] = queries > 0 ? 100.0 * last.prefix_hit_tokens / queries : 0.0;
  state.counters["restored_%"] = queries > 0 ? 100.0 * last.prefix_restored_tokens / queries : 0.0;
  state.counters["req/s"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * requests.size(), benchmark::Counter::kIsRate);
  state.counters["ttft_ms"] =
      1e3 * ttft_sum / (static_cast<double>(state.iterations()) * requests.size());
  state.counters["ttft2_ms"] =
      1e3 * ttft2_sum / (static_cast<double>(state.iterations()) * kPrefixes);
}
BENCHMARK(BM_SharedPrefixTiers)
    ->ArgName("tiers")
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Iterations(1)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// LlamaModel::Forward alone: `batch` sequences decoding from position kPromptLen + 4 on, with
// logits for every sequence (as the engine asks for). Arg: batch.
void BM_ModelDecodeStep(benchmark::State& state) {
  const LoadedModel* model = Model();
  if (model == nullptr) {
    state.SkipWithError("gpt2 tokenizer not found");
    return;
  }
  static cpu::ThreadPool pool(0);  // every core, as EngineOptions::num_threads = 0
  const int batch = static_cast<int>(state.range(0));
  DecodeHarness h(model->weights.get(), &pool, batch, kPromptLen + kMaxTokens);
  h.Prefill(kPromptLen);
  h.Seek(kPromptLen + 3);
  for (auto _ : state) h.Decode();
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(state.iterations()) * batch,
                                               benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ModelDecodeStep)->ArgName("batch")->Arg(1)->Arg(64)->UseRealTime()->Unit(
    benchmark::kMillisecond);

}  // namespace
}  // namespace kvserve

BENCHMARK_MAIN();
