// End to end on the GPU: greedy tokens of stories260K through LlamaModel on the CUDA backend
// (f32 weights kept f32) equal the CPU's for 64 tokens. Skips without a CUDA device.

#include <algorithm>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "worker/kv/kv_cache.h"
#include "worker/model/batch_builder.h"
#include "worker/model/llama_model.h"
#include "worker/model/loaded_model.h"

namespace kvserve {
namespace {

constexpr int kBlockSize = 16;

std::vector<TokenId> Greedy(const ModelWeights* weights, Backend* backend, int max_tokens) {
  cpu::ThreadPool pool(2);
  std::unique_ptr<LlamaModel> model = *LlamaModel::Create(weights, &pool, nullptr, backend);
  const int64_t blocks = (weights->config.max_position_embeddings + kBlockSize - 1) / kBlockSize;
  std::unique_ptr<KvCache> cache =
      *KvCache::Create(weights->config, blocks, kBlockSize, KvCacheDType::kF32, backend);
  std::vector<int32_t> table(blocks);
  std::iota(table.rbegin(), table.rend(), 0);
  BatchBuilder builder;
  std::vector<TokenId> tokens = {1, 403, 407};  // BOS "Once upon"
  std::vector<float> logits(weights->config.vocab_size);
  int32_t pos = 0;
  std::vector<TokenId> out;
  std::span<const TokenId> feed(tokens);
  for (int i = 0; i <= max_tokens; ++i) {
    builder.Clear();
    builder.AddSequence(feed, pos, table, kBlockSize, true);
    absl::Status s = model->Forward(builder.Build(), *cache, logits.data());
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) break;
    pos += static_cast<int32_t>(feed.size());
    if (i == max_tokens) break;
    const TokenId next =
        static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(next);
    tokens.push_back(next);
    feed = std::span<const TokenId>(tokens).last(1);
  }
  return out;
}

TEST(CudaModelTest, GreedyTokensOnStories260KMatchTheCpu) {
  KVSERVE_REQUIRE_CUDA(gpu);
  absl::StatusOr<LoadedModel> m =
      LoadModel(KVSERVE_SHARED_DIR "/models/stories260K/stories260K.gguf");
  ASSERT_TRUE(m.ok()) << m.status();
  const std::vector<TokenId> cpu = Greedy(m->weights.get(), nullptr, 64);
  const std::vector<TokenId> cuda = Greedy(m->weights.get(), gpu, 64);
  ASSERT_EQ(cpu.size(), 64u);
  EXPECT_EQ(cuda, cpu);
}

}  // namespace
}  // namespace kvserve
