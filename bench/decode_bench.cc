// Decode and prefill throughput of the CPU forward pass, with the memory bandwidth of this machine
// measured in the same run so that results read as a fraction of the hardware limit.
//
//   build/bench/decode_bench                      # all cases
//   build/bench/decode_bench --benchmark_filter=BM_DecodeSynthetic --benchmark_repetitions=3
//
// Counters: tok/s (tokens generated per second), weight_GB/s (bytes of weights and KV read per
// step / step time), triad_GB/s (STREAM triad of the same threads right after the case, on huge
// pages as the weights are), bw_ratio = weight_GB/s / triad_GB/s, read_GB/s (a plain read of
// 512 MiB by the same threads, right after the triad: the ceiling of a kernel that only reads)
// and read_ratio = weight_GB/s / read_GB/s; prefill reports GFLOP/s, the
// register-only FMA peak of the same threads measured right after it (peak_GFLOP/s,
// bench/peak_fma.h) and their ratio; BM_DecodeKvDtype compares KV cache dtypes at a long context.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "bench/decode_harness.h"
#include "bench/peak_fma.h"
#include "kernels/cpu/membw.h"
#include "kernels/cpu/thread_pool.h"
#include "worker/kv/kv_cache.h"
#include "worker/model/loaded_model.h"
#include "worker/model/synthetic_model.h"

namespace kvserve {
namespace {

// All hardware threads (threads = 0) or exactly `threads`.
cpu::ThreadPool& Pool(int threads = 0) {
  static cpu::ThreadPool all(0);
  static cpu::ThreadPool one(1);
  static cpu::ThreadPool two(2);
  return threads == 1 ? one : (threads == 2 ? two : all);
}

// The STREAM triad of the same threads, measured right after the benchmark it scales (the same
// machine load), best of 3 passes over 3 x 256 MiB.
double TriadBytesPerSecond(cpu::ThreadPool* pool) {
  return cpu::MeasureTriadBandwidth(pool, size_t{256} << 20, 3);
}

// A plain read of 512 MiB by the same threads, best of 3.
double ReadBytesPerSecond(cpu::ThreadPool* pool) {
  return cpu::MeasureReadBandwidth(pool, size_t{512} << 20, 3);
}

// Bytes a decode step streams from memory: every matmul weight once (the embedding row gather is
// negligible) plus the K/V of the attended context.
double BytesPerDecodeStep(const ModelWeights& w, int batch, int context) {
  const double weights = static_cast<double>(
      w.TotalBytes() - w.token_embedding.nbytes() +
      (w.output.data == w.token_embedding.data ? w.token_embedding.nbytes() : 0));
  const double kv = static_cast<double>(KvCache::BytesPerToken(w.config)) * context * batch;
  return weights + kv;
}

// Issue 13's model: 8 layers, hidden 1024, 16 query / 4 KV heads, FFN 2816, vocab 32000 (156M).
const ModelWeights* SyntheticModel(DType dtype) {
  static std::map<DType, std::unique_ptr<ModelWeights>> models;
  std::unique_ptr<ModelWeights>& m = models[dtype];
  if (m == nullptr) {
    SyntheticModelOptions o;
    o.num_layers = 8;
    o.hidden_size = 1024;
    o.num_heads = 16;
    o.num_kv_heads = 4;
    o.intermediate_size = 2816;
    o.vocab_size = 32000;
    o.dtype = dtype;
    m = *MakeSyntheticModel(o);
  }
  return m.get();
}

const ModelWeights* Stories260K() {
  static LoadedModel model = *LoadModel(KVSERVE_SHARED_DIR "/models/stories260K/stories260K.gguf");
  return model.weights.get();
}

void RunDecode(benchmark::State& state, const ModelWeights* w, int batch, int threads = 0) {
  const int max_len = 512;
  cpu::ThreadPool* pool = &Pool(threads);
  DecodeHarness h(w, pool, batch, max_len);
  h.Prefill(64);
  double bytes = 0;
  for (auto _ : state) {
    bytes += BytesPerDecodeStep(*w, batch, h.pos() + 1);
    h.Decode();
  }
  const double triad = TriadBytesPerSecond(pool);
  const double read = ReadBytesPerSecond(pool);
  state.counters["threads"] = pool->num_threads();
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(state.iterations()) * batch,
                                               benchmark::Counter::kIsRate);
  state.counters["weight_GB/s"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsRate);
  state.counters["triad_GB/s"] = triad / 1e9;
  state.counters["bw_ratio"] = benchmark::Counter(bytes / triad, benchmark::Counter::kIsRate);
  state.counters["read_GB/s"] = read / 1e9;
  state.counters["read_ratio"] = benchmark::Counter(bytes / read, benchmark::Counter::kIsRate);
  state.counters["weights_MB"] = static_cast<double>(w->TotalBytes()) / 1e6;
}

// Multiply-adds per token of the layers' matmuls (without the output head).
double LayerMatmulParams(const ModelConfig& c) {
  return static_cast<double>(
      int64_t{c.num_layers} *
      (int64_t{c.hidden_size} * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads) +
       3 * int64_t{c.hidden_size} * c.intermediate_size));
}

// FLOPs of QK^T and PV for one query token attending to `context` positions.
double AttentionFlops(const ModelConfig& c, double context) {
  return 2.0 * 2.0 * c.num_layers * c.num_heads * c.head_dim * context;
}

void RunPrefill(benchmark::State& state, const ModelWeights* w, int len) {
  const ModelConfig& c = w->config;
  // 2 FLOPs per weight per token (logits only for the last token), plus QK^T and PV over the
  // causal triangle.
  const double matmul_params =
      LayerMatmulParams(c) + static_cast<double>(int64_t{c.vocab_size} * c.hidden_size) / len;
  const double flops = 2.0 * matmul_params * len + AttentionFlops(c, len * (len + 1) / 2.0);
  DecodeHarness h(w, &Pool(), 1, len);
  for (auto _ : state) h.Prefill(len);
  // The register-only FMA peak of the same threads, measured right after (same machine load).
  const double peak = bench::PeakFlopsPerSecond(&Pool());
  state.counters["peak_GFLOP/s"] = peak / 1e9;
  state.counters["peak_ratio"] =
      benchmark::Counter(flops * static_cast<double>(state.iterations()) / std::max(peak, 1.0),
                         benchmark::Counter::kIsRate);
  state.counters["GFLOP/s"] = benchmark::Counter(
      flops * static_cast<double>(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(state.iterations()) * len,
                                               benchmark::Counter::kIsRate);
}

void BM_DecodeStories260K(benchmark::State& state) {
  RunDecode(state, Stories260K(), static_cast<int>(state.range(0)));
}
BENCHMARK(BM_DecodeStories260K)->Arg(1)->Arg(32)->UseRealTime();

// Args: dtype, batch, threads (0 = all).
void BM_DecodeSynthetic(benchmark::State& state) {
  RunDecode(state, SyntheticModel(static_cast<DType>(state.range(0))),
            static_cast<int>(state.range(1)), static_cast<int>(state.range(2)));
  state.SetLabel(std::string(DTypeName(static_cast<DType>(state.range(0)))));
}
BENCHMARK(BM_DecodeSynthetic)
    ->ArgsProduct({{static_cast<int>(DType::kF32), static_cast<int>(DType::kBF16),
                    static_cast<int>(DType::kF16), static_cast<int>(DType::kQ8_0),
                    static_cast<int>(DType::kQ4_0), static_cast<int>(DType::kQ4_K),
                    static_cast<int>(DType::kQ5_K), static_cast<int>(DType::kQ6_K)},
                   {1, 32},
                   {1, 0}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// Batch scaling, issue 13's "batch 32 >= 10 x batch 1": batch-1 and batch-32 decode of the same
// model on the same threads, interleaved round by round (a few batch-1 steps, then one batch-32
// step, about as long), so that both see the same machine: this VM's memory bandwidth and clock
// drift by 20-50 % within seconds, and separate cases then compare different machines. Each size
// first runs one untimed step per round: on the Zen 5 VM a batch-32 step right after batch-1 steps
// ran 3-6 % slower than one after another batch-32 step (its attention, SiLU and norms 12-20 %
// slower, as if its K/V and activations were no longer partly in cache), which a server decoding
// one batch size step after step does not pay (docs/benchmarks.md, "Attention softmax and SiLU
// kernels").
// Counters are medians over the rounds: b1_tok/s, b32_tok/s, x_batch1 = b32_tok/s / b1_tok/s;
// b32_GFLOP/s (2 FLOPs per weight per token, the output head included, plus attention) and
// peak_ratio = that over the register-only FMA peak of the same threads, measured right after. Both
// harnesses decode positions 64-320 (wrapping), so their attention costs match. Args: dtype,
// threads (0 = all).
void BM_BatchScaling(benchmark::State& state) {
  const auto dtype = static_cast<DType>(state.range(0));
  const ModelWeights* w = SyntheticModel(dtype);
  const ModelConfig& c = w->config;
  cpu::ThreadPool* pool = &Pool(static_cast<int>(state.range(1)));
  constexpr int kBatch = 32;
  constexpr int kMaxLen = 320;
  constexpr int kBatch1StepsPerRound = 4;
  DecodeHarness one(w, pool, 1, kMaxLen);
  DecodeHarness many(w, pool, kBatch, kMaxLen);
  one.Prefill(64);
  many.Prefill(64);
  std::vector<double> b1, b32, b32_flops;
  using Clock = std::chrono::steady_clock;
  for (auto _ : state) {
    one.Decode();  // untimed: the step after the other size's
    const Clock::time_point t0 = Clock::now();
    for (int i = 0; i < kBatch1StepsPerRound; ++i) one.Decode();
    const Clock::time_point t1 = Clock::now();
    many.Decode();  // untimed, likewise
    const double context = many.pos() + 1;
    const Clock::time_point t2 = Clock::now();
    many.Decode();
    const double s1 = std::chrono::duration<double>(t1 - t0).count();
    const double s32 = std::chrono::duration<double>(Clock::now() - t2).count();
    b1.push_back(kBatch1StepsPerRound / s1);
    b32.push_back(kBatch / s32);
    const double flops_per_token =
        2.0 * (LayerMatmulParams(c) + static_cast<double>(int64_t{c.vocab_size} * c.hidden_size)) +
        AttentionFlops(c, context);
    b32_flops.push_back(kBatch * flops_per_token / s32);
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  const double peak = bench::PeakFlopsPerSecond(pool);
  state.counters["threads"] = pool->num_threads();
  state.counters["b1_tok/s"] = median(b1);
  state.counters["b32_tok/s"] = median(b32);
  state.counters["x_batch1"] = median(b32) / std::max(median(b1), 1e-9);
  state.counters["b32_GFLOP/s"] = median(b32_flops) / 1e9;
  state.counters["peak_GFLOP/s"] = peak / 1e9;
  state.counters["peak_ratio"] = median(b32_flops) / std::max(peak, 1.0);
  state.SetLabel(std::string(DTypeName(dtype)));
}
BENCHMARK(BM_BatchScaling)
    ->ArgsProduct({{static_cast<int>(DType::kF32), static_cast<int>(DType::kBF16),
                    static_cast<int>(DType::kF16)},
                   {1, 0}})
    ->Iterations(15)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// KV cache dtype: decode at a long context, where reading K/V is a large part of each step.
// Small model (8 layers, hidden 512, 8 KV heads, bf16 weights), 16 sequences at ~1024 tokens
// (positions jumped to, not prefilled). Args: KvCacheDType, batch. Counters: tok/s, kv_bytes per
// token, seqs_per_GiB = how many 1024-token sequences a GiB of KV holds.
void BM_DecodeKvDtype(benchmark::State& state) {
  static const std::unique_ptr<ModelWeights> model = [] {
    SyntheticModelOptions o;
    o.num_layers = 8;
    o.hidden_size = 512;
    o.num_heads = 8;
    o.num_kv_heads = 8;
    o.intermediate_size = 1408;
    o.vocab_size = 4096;
    o.dtype = DType::kBF16;
    return *MakeSyntheticModel(o);
  }();
  const auto kv_dtype = static_cast<KvCacheDType>(state.range(0));
  const int batch = static_cast<int>(state.range(1));
  const int context = 1024;
  DecodeHarness h(model.get(), &Pool(), batch, context + 64, kv_dtype);
  h.Seek(context);
  h.Decode();  // warm-up
  for (auto _ : state) {
    h.Decode();
    if (h.pos() >= context + 60) h.Seek(context);
  }
  const double kv_bytes = static_cast<double>(KvCache::BytesPerToken(model->config, kv_dtype));
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(state.iterations()) * batch,
                                               benchmark::Counter::kIsRate);
  state.counters["kv_bytes/token"] = kv_bytes;
  state.counters["seqs_per_GiB"] = static_cast<double>(int64_t{1} << 30) / (kv_bytes * context);
  state.SetLabel(std::string(KvCacheDTypeName(kv_dtype)));
}
BENCHMARK(BM_DecodeKvDtype)
    ->ArgsProduct({{static_cast<int>(KvCacheDType::kF32), static_cast<int>(KvCacheDType::kBF16),
                    static_cast<int>(KvCacheDType::kInt8),
                    static_cast<int>(KvCacheDType::kFp8E4M3)},
                   {16}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

void BM_PrefillSynthetic(benchmark::State& state) {
  RunPrefill(state, SyntheticModel(static_cast<DType>(state.range(0))),
             static_cast<int>(state.range(1)));
  state.SetLabel(std::string(DTypeName(static_cast<DType>(state.range(0)))));
}
BENCHMARK(BM_PrefillSynthetic)
    ->Args({static_cast<int>(DType::kF32), 256})
    ->Args({static_cast<int>(DType::kBF16), 256})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kvserve

BENCHMARK_MAIN();
