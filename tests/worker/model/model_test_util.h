#ifndef KVSERVE_TESTS_WORKER_MODEL_MODEL_TEST_UTIL_H_
#define KVSERVE_TESTS_WORKER_MODEL_MODEL_TEST_UTIL_H_

// Test-only helpers shared by the model tests.

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/thread_pool.h"
#include "worker/kv/kv_cache.h"
#include "worker/model/batch_builder.h"
#include "worker/model/llama_model.h"
#include "worker/model/loaded_model.h"

namespace kvserve::testing_model {

/// Logits of the last prompt token: one sequence prefilled in a private cache of `dtype` on
/// `threads`.
inline std::vector<float> LastLogits(const LoadedModel& m, const std::vector<TokenId>& prompt,
                                     int threads = 1, KvCacheDType dtype = KvCacheDType::kF32) {
  cpu::ThreadPool pool(threads);
  std::unique_ptr<LlamaModel> model = *LlamaModel::Create(m.weights.get(), &pool);
  const int block_size = 16;
  const int blocks = (m.config().max_position_embeddings + block_size - 1) / block_size;
  std::unique_ptr<KvCache> cache = *KvCache::Create(m.config(), blocks, block_size, dtype);
  std::vector<int32_t> table(blocks);
  std::iota(table.begin(), table.end(), 0);
  BatchBuilder builder;
  builder.AddSequence(prompt, 0, table, block_size, true);
  std::vector<float> logits(m.config().vocab_size);
  absl::Status s = model->Forward(builder.Build(), *cache, logits.data());
  EXPECT_TRUE(s.ok()) << s;
  return logits;
}

/// max |got - ref| over max(1, max |ref|); *max_ref (if given) receives max |ref|.
inline float MaxRelativeError(const std::vector<float>& got, const std::vector<float>& ref,
                              float* max_ref = nullptr) {
  EXPECT_EQ(got.size(), ref.size());
  float scale = 0.0f, err = 0.0f;
  for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
    scale = std::max(scale, std::fabs(ref[i]));
    err = std::max(err, std::fabs(got[i] - ref[i]));
  }
  if (max_ref != nullptr) *max_ref = scale;
  return err / std::max(1.0f, scale);
}

}  // namespace kvserve::testing_model

#endif  // KVSERVE_TESTS_WORKER_MODEL_MODEL_TEST_UTIL_H_
