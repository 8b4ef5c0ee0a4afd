// Decode and prefill throughput of the CPU forward pass, with the memory bandwidth of this machine
// measured in the same run so that results read as a fraction of the hardware limit.
//
//   build/bench/decode_bench                      # all cases
//   build/bench/decode_bench --benchmark_filter=Decode/synthetic
//
// Counters: tok/s (tokens generated per second), weight_GB/s (bytes of weights and KV read per
// step / step time), triad_GB/s (STREAM triad measured at start-up), bw_ratio = weight_GB/s /
// triad_GB/s; prefill reports GFLOP/s.

#include <benchmark/benchmark.h>

#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/cpu/membw.h"
#include "kernels/cpu/thread_pool.h"
#include "worker/kv/kv_cache.h"
#include "worker/model/batch_builder.h"
#include "worker/model/llama_model.h"
#include "worker/model/loaded_model.h"
#include "worker/model/synthetic_model.h"

namespace kvserve {
namespace {

cpu::ThreadPool& Pool() {
  static cpu::ThreadPool pool(0);
  return pool;
}

double TriadBytesPerSecond() {
  static const double bw = cpu::MeasureTriadBandwidth(&Pool(), size_t{256} << 20, 5);
  return bw;
}

// Runs `batch` independent sequences of one model through prefill, then one decode step per
// benchmark iteration. Sequence s owns a contiguous range of blocks.
class DecodeHarness {
 public:
  DecodeHarness(const ModelWeights* weights, int batch, int max_len)
      : weights_(weights), batch_(batch), max_len_(max_len) {
    model_ = *LlamaModel::Create(weights, &Pool());
    const int blocks_per_seq = (max_len + kBlockSize - 1) / kBlockSize;
    cache_ = *KvCache::Create(weights->config, int64_t{blocks_per_seq} * batch, kBlockSize);
    tables_.resize(batch);
    for (int s = 0; s < batch; ++s) {
      tables_[s].resize(blocks_per_seq);
      std::iota(tables_[s].begin(), tables_[s].end(), s * blocks_per_seq);
    }
    logits_.resize(static_cast<size_t>(weights->config.vocab_size) * batch);
  }

  // Runs `len` prompt tokens of every sequence as one batch.
  void Prefill(int len) {
    Step(0, len);
    pos_ = len;
  }

  // One decode step for every sequence; wraps around before the cache is full.
  void Decode() {
    if (pos_ >= max_len_) pos_ = max_len_ / 2;
    Step(pos_, 1);
    ++pos_;
  }

  int pos() const { return pos_; }

 private:
  static constexpr int kBlockSize = 16;

  void Step(int start, int len) {
    builder_.Clear();
    std::vector<TokenId> tokens(len);
    for (int s = 0; s < batch_; ++s) {
      for (int j = 0; j < len; ++j) {
        tokens[j] = ((start + j) * 7 + s * 13 + 3) % weights_->config.vocab_size;
      }
      builder_.AddSequence(tokens, start, tables_[s], kBlockSize, /*want_logits=*/true);
    }
    absl::Status s = model_->Forward(builder_.Build(), *cache_, logits_.data());
    if (!s.ok()) std::fprintf(stderr, "forward failed: %s\n", s.ToString().c_str());
  }

  const ModelWeights* weights_;
  int batch_;
  int max_len_;
  int pos_ = 0;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<KvCache> cache_;
  std::vector<std::vector<int32_t>> tables_;
  std::vector<float> logits_;
  BatchBuilder builder_;
};

// Bytes a decode step streams from memory: every matmul weight once (the embedding row gather is
// negligible) plus the K/V of the attended context.
double BytesPerDecodeStep(const ModelWeights& w, int batch, int context) {
  const double weights = static_cast<double>(w.TotalBytes() - w.token_embedding.nbytes() +
                                             (w.output.data == w.token_embedding.data
                                                  ? w.token_embedding.nbytes()
                                                  : 0));
  const double kv = static_cast<double>(KvCache::BytesPerToken(w.config)) * context * batch;
  return weights + kv;
}

const ModelWeights* SyntheticModel(DType dtype) {
  static std::unique_ptr<ModelWeights> models[5];
  auto& m = models[static_cast<int>(dtype)];
  if (m == nullptr) {
    SyntheticModelOptions o;
    o.num_layers = 8;
    o.hidden_size = 1024;
    o.num_heads = 16;
    o.num_kv_heads = 16;
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

void RunDecode(benchmark::State& state, const ModelWeights* w, int batch) {
  const int max_len = 512;
  DecodeHarness h(w, batch, max_len);
  h.Prefill(64);
  double bytes = 0;
  for (auto _ : state) {
    bytes += BytesPerDecodeStep(*w, batch, h.pos() + 1);
    h.Decode();
  }
  const double triad = TriadBytesPerSecond();
  state.counters["tok/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * batch, benchmark::Counter::kIsRate);
  state.counters["weight_GB/s"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsRate);
  state.counters["triad_GB/s"] = triad / 1e9;
  state.counters["bw_ratio"] = benchmark::Counter(bytes / triad, benchmark::Counter::kIsRate);
  state.counters["weights_MB"] = static_cast<double>(w->TotalBytes()) / 1e6;
}

void RunPrefill(benchmark::State& state, const ModelWeights* w, int len) {
  const ModelConfig& c = w->config;
  // 2 FLOPs per weight per token, plus QK^T and PV over the causal triangle.
  const double matmul_params = static_cast<double>(
      int64_t{c.num_layers} * (int64_t{c.hidden_size} * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads) +
                               3 * int64_t{c.hidden_size} * c.intermediate_size) +
      int64_t{c.vocab_size} * c.hidden_size / len);  // logits only for the last token
  const double attn = 2.0 * 2.0 * c.num_layers * c.num_heads * c.head_dim * (len * (len + 1) / 2.0);
  const double flops = 2.0 * matmul_params * len + attn;
  DecodeHarness h(w, 1, len);
  for (auto _ : state) h.Prefill(len);
  state.counters["GFLOP/s"] = benchmark::Counter(flops * static_cast<double>(state.iterations()) / 1e9,
                                                 benchmark::Counter::kIsRate);
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(state.iterations()) * len,
                                               benchmark::Counter::kIsRate);
}

void BM_DecodeStories260K(benchmark::State& state) {
  RunDecode(state, Stories260K(), static_cast<int>(state.range(0)));
}
BENCHMARK(BM_DecodeStories260K)->Arg(1)->Arg(32)->UseRealTime();

void BM_DecodeSynthetic(benchmark::State& state) {
  RunDecode(state, SyntheticModel(static_cast<DType>(state.range(0))),
            static_cast<int>(state.range(1)));
  state.SetLabel(std::string(DTypeName(static_cast<DType>(state.range(0)))));
}
BENCHMARK(BM_DecodeSynthetic)
    ->ArgsProduct({{static_cast<int>(DType::kF32), static_cast<int>(DType::kBF16),
                    static_cast<int>(DType::kF16), static_cast<int>(DType::kQ8_0)},
                   {1, 32}})
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
