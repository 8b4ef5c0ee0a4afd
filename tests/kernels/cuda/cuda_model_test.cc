// End to end on the GPU: greedy tokens of stories260K through LlamaModel on the CUDA backend
// (f32 weights kept f32) equal the CPU's for 64 tokens, launching every op and replaying decode
// steps from CUDA graphs; and, on machines with two or more GPUs, split over them with NCCL
// (tensor parallelism). Skips without a CUDA device.

#include <cstdio>
#include <algorithm>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "worker/kv/kv_cache.h"
#include "worker/model/batch_builder.h"
#include "worker/model/llama_model.h"
#include "worker/model/loaded_model.h"
#include "worker/tp/nccl_group.h"
#include "worker/tp/tp_model.h"

namespace kvserve {
namespace {

constexpr int kBlockSize = 16;

std::vector<TokenId> Greedy(const ModelWeights* weights, Backend* backend, int max_tokens,
                            DecodeGraphStats* graphs = nullptr) {
  cpu::ThreadPool pool(2);
  std::unique_ptr<LlamaModel> model = *LlamaModel::Create(weights, &pool, nullptr, backend);
  const int64_t blocks = (weights->config.max_position_embeddings + kBlockSize - 1) / kBlockSize;
  if (graphs != nullptr) {
    DecodeGraphOptions options;
    options.max_batch = 8;
    options.max_context_len = weights->config.max_position_embeddings;
    options.block_table_stride = blocks;
    absl::Status s = model->EnableDecodeGraphs(options);
    EXPECT_TRUE(s.ok()) << s;
  }
  // Block 0 stays out of the table: graph padding rows write to it.
  std::unique_ptr<KvCache> cache =
      *KvCache::Create(weights->config, blocks + 1, kBlockSize, KvCacheDType::kF32, backend);
  std::vector<int32_t> table(blocks);
  std::iota(table.rbegin(), table.rend(), 1);
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
  if (graphs != nullptr) {
    *graphs = model->decode_graph_stats();
    EXPECT_TRUE(model->decode_graph_error().empty()) << model->decode_graph_error();
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

TEST(CudaModelTest, DecodeStepsReplayedFromCudaGraphsGiveTheCpuTokens) {
  KVSERVE_REQUIRE_CUDA(gpu);
  ASSERT_TRUE(gpu->supports_graphs());
  absl::StatusOr<LoadedModel> m =
      LoadModel(KVSERVE_SHARED_DIR "/models/stories260K/stories260K.gguf");
  ASSERT_TRUE(m.ok()) << m.status();
  const std::vector<TokenId> cpu = Greedy(m->weights.get(), nullptr, 64);
  DecodeGraphStats stats;
  const std::vector<TokenId> cuda = Greedy(m->weights.get(), gpu, 64, &stats);
  EXPECT_EQ(cuda, cpu);
  EXPECT_EQ(stats.captures, 1);
  EXPECT_EQ(stats.replays, 64);
}

TEST(CudaModelTest, TensorParallelOverNcclGivesTheCpuTokens) {
  KVSERVE_REQUIRE_CUDA(gpu);
  absl::StatusOr<LoadedModel> m =
      LoadModel(KVSERVE_SHARED_DIR "/models/stories260K/stories260K.gguf");
  ASSERT_TRUE(m.ok()) << m.status();
  // stories260K has 4 kv heads: tp 2 splits them, tp 4 gives each rank one.
  const std::vector<TokenId> cpu = Greedy(m->weights.get(), nullptr, 64);
  KVSERVE_REQUIRE_DEVICES(2);
  for (int tp : {2, 4}) {
    if (tp > testing_cuda::UsableDevices()) {
      std::printf("tp %d left out: %d CUDA devices present\n", tp, testing_cuda::UsableDevices());
      continue;
    }
    TensorParallelOptions options;
    options.tp_size = tp;
    options.make_backend = [](int rank) { return testing_cuda::LoadTestBackend(rank); };
    options.make_communicators = [](int n) {
      return CreateNcclGroup(n, testing_cuda::UseSimulator());
    };
    absl::StatusOr<std::unique_ptr<TensorParallelModel>> model =
        TensorParallelModel::Create(m->weights.get(), options);
    ASSERT_TRUE(model.ok()) << "tp " << tp << ": " << model.status();
    const int64_t blocks = m->config().max_position_embeddings / kBlockSize + 1;
    auto cache = *(*model)->CreateKvCache(blocks, kBlockSize);
    std::vector<int32_t> table(blocks - 1);
    std::iota(table.begin(), table.end(), 1);
    BatchBuilder builder;
    std::vector<TokenId> tokens = {1, 403, 407};
    std::vector<float> logits(m->config().vocab_size);
    int32_t pos = 0;
    std::vector<TokenId> out;
    for (int i = 0; i < 64; ++i) {
      builder.Clear();
      std::span<const TokenId> feed(tokens.data() + pos, tokens.size() - pos);
      builder.AddSequence(feed, pos, table, kBlockSize, true);
      absl::Status s = (*model)->Forward(builder.Build(), *cache, logits.data());
      ASSERT_TRUE(s.ok()) << s;
      pos = static_cast<int32_t>(tokens.size());
      out.push_back(static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) -
                                         logits.begin()));
      tokens.push_back(out.back());
    }
    EXPECT_EQ(out, cpu) << "tp " << tp;
  }
}

}  // namespace
}  // namespace kvserve
