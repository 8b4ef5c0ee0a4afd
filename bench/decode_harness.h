// Test harness shared by the model benchmarks: a LlamaModel, a KV cache and `batch` independent
// sequences, stepped through LlamaModel::Forward directly (no engine).
#ifndef KVSERVE_BENCH_DECODE_HARNESS_H_
#define KVSERVE_BENCH_DECODE_HARNESS_H_

#include <cstdio>
#include <memory>
#include <numeric>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "kernels/kv_dtype.h"
#include "worker/kv/kv_cache.h"
#include "worker/model/batch_builder.h"
#include "worker/model/llama_model.h"

namespace kvserve {

// Runs `batch` independent sequences of one model through prefill, then one decode step per
// benchmark iteration. Sequence s owns a contiguous range of blocks.
class DecodeHarness {
 public:
  DecodeHarness(const ModelWeights* weights, cpu::ThreadPool* pool, int batch, int max_len,
                KvCacheDType kv_dtype = KvCacheDType::kF32)
      : weights_(weights), batch_(batch), max_len_(max_len) {
    model_ = *LlamaModel::Create(weights, pool);
    const int blocks_per_seq = (max_len + kBlockSize - 1) / kBlockSize;
    cache_ = *KvCache::Create(weights->config, int64_t{blocks_per_seq} * batch, kBlockSize,
                              kv_dtype);
    tables_.resize(batch);
    for (int s = 0; s < batch; ++s) {
      tables_[s].resize(blocks_per_seq);
      std::iota(tables_[s].begin(), tables_[s].end(), s * blocks_per_seq);
    }
    logits_.resize(static_cast<size_t>(weights->config.vocab_size) * batch);
  }

  // Runs `len` prompt tokens of every sequence as one batch.
  void Prefill(int len) {
    pos_ = 0;
    Step(0, len);
    pos_ = len;
  }

  // One decode step for every sequence; wraps around before the cache is full.
  void Decode() {
    if (pos_ >= max_len_) pos_ = max_len_ / 2;
    Step(pos_, 1);
    ++pos_;
  }

  // Jumps to position `pos` without computing the tokens before it (their K/V stay whatever the
  // cache holds): decode speed at a long context without paying for its prefill.
  void Seek(int pos) { pos_ = pos; }

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

}  // namespace kvserve

#endif  // KVSERVE_BENCH_DECODE_HARNESS_H_
