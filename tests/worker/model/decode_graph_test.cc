// Decode steps replayed from graphs (LlamaModel::EnableDecodeGraphs) on the CPU backend's graph
// twin: the padding, the fixed staging layout, capture on first use, recapture after a buffer
// moved, and the eager fallbacks, all checked bit for bit against a model without graphs. CUDA
// runs the same model code with real CUDA graphs (tests/kernels/cuda/cuda_model_test.cc).

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <span>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/worker/model/golden.h"
#include "worker/model/batch_builder.h"
#include "worker/model/llama_model.h"
#include "worker/model/loaded_model.h"

namespace kvserve {
namespace {

using testing_golden::kStoriesGguf;
using testing_golden::LoadStoriesGolden;

constexpr int kBlockSize = 16;

TEST(DecodeGraphBatchSizesTest, PowersOfTwoThenMultiplesOfEight) {
  EXPECT_EQ(DecodeGraphBatchSizes(1), (std::vector<int32_t>{1}));
  EXPECT_EQ(DecodeGraphBatchSizes(5), (std::vector<int32_t>{1, 2, 4, 5}));
  EXPECT_EQ(DecodeGraphBatchSizes(8), (std::vector<int32_t>{1, 2, 4, 8}));
  EXPECT_EQ(DecodeGraphBatchSizes(20), (std::vector<int32_t>{1, 2, 4, 8, 16, 20}));
  EXPECT_EQ(DecodeGraphBatchSizes(32), (std::vector<int32_t>{1, 2, 4, 8, 16, 24, 32}));
}

// One model over one cache; sequences get disjoint block tables (never block 0, the null block
// that padding rows write to).
class Runner {
 public:
  Runner(const ModelWeights* weights, cpu::ThreadPool* pool, bool graphs, int max_seqs)
      : backend_(pool, graphs) {
    model_ = *LlamaModel::Create(weights, pool, nullptr, &backend_);
    const int64_t max_len = weights->config.max_position_embeddings;
    blocks_per_seq_ = (max_len + kBlockSize - 1) / kBlockSize;
    cache_ = *KvCache::Create(weights->config, 1 + max_seqs * blocks_per_seq_, kBlockSize);
    tables_.resize(max_seqs);
    for (int s = 0; s < max_seqs; ++s) {
      tables_[s].resize(blocks_per_seq_);
      // Blocks in reverse order inside each sequence's range, to exercise the table.
      std::iota(tables_[s].rbegin(), tables_[s].rend(), 1 + s * blocks_per_seq_);
    }
    pos_.assign(max_seqs, 0);
  }

  LlamaModel& model() { return *model_; }
  int64_t blocks_per_seq() const { return blocks_per_seq_; }

  // One step: sequence ids[i] gets tokens[i] (a prefill chunk or one decode token); returns the
  // logits of each sequence's last token, concatenated.
  std::vector<float> Step(std::span<const int> ids,
                          std::span<const std::vector<TokenId>> tokens) {
    builder_.Clear();
    for (size_t i = 0; i < ids.size(); ++i) {
      builder_.AddSequence(tokens[i], pos_[ids[i]], tables_[ids[i]], kBlockSize, true);
      pos_[ids[i]] += static_cast<int32_t>(tokens[i].size());
    }
    std::vector<float> logits(ids.size() * model_->config().vocab_size);
    absl::Status s = model_->Forward(builder_.Build(), *cache_, logits.data());
    EXPECT_TRUE(s.ok()) << s;
    return logits;
  }

 private:
  cpu::CpuBackend backend_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<KvCache> cache_;
  int64_t blocks_per_seq_ = 0;
  std::vector<std::vector<int32_t>> tables_;
  std::vector<int32_t> pos_;
  BatchBuilder builder_;
};

TokenId ArgMax(std::span<const float> row) {
  return static_cast<TokenId>(std::max_element(row.begin(), row.end()) - row.begin());
}

class DecodeGraphTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<LoadedModel> m = LoadModel(kStoriesGguf);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    vocab_ = model_.config().vocab_size;
  }
  DecodeGraphOptions Options(int max_batch) const {
    DecodeGraphOptions o;
    o.max_batch = max_batch;
    o.max_context_len = model_.config().max_position_embeddings;
    o.block_table_stride = (o.max_context_len + kBlockSize - 1) / kBlockSize;
    return o;
  }

  cpu::ThreadPool pool_{2};
  LoadedModel model_;
  int64_t vocab_ = 0;
};

TEST_F(DecodeGraphTest, GreedyDecodeFromGraphsMatchesTheGolden) {
  const auto golden = LoadStoriesGolden();
  const auto& c = golden.cases[0];
  Runner runner(model_.weights.get(), &pool_, /*graphs=*/true, 1);
  ASSERT_TRUE(runner.model().EnableDecodeGraphs(Options(4)).ok());
  const int ids[] = {0};
  std::vector<std::vector<TokenId>> step = {c.prompt_ids};
  std::vector<TokenId> out;
  std::vector<float> logits = runner.Step(ids, step);
  for (size_t i = 0; i < c.generated_ids.size(); ++i) {
    out.push_back(ArgMax(logits));
    step = {{out.back()}};
    logits = runner.Step(ids, step);
  }
  EXPECT_EQ(out, c.generated_ids);
  const DecodeGraphStats& stats = runner.model().decode_graph_stats();
  EXPECT_EQ(stats.captures, 1);  // batch 1 only; the prompt ran eagerly
  // Every decode step but the one that captured (it ran eagerly, the graph was not launched).
  EXPECT_EQ(stats.replays, static_cast<int64_t>(c.generated_ids.size()) - 1);
  EXPECT_EQ(stats.eager_decodes, 0);
}

TEST_F(DecodeGraphTest, PaddedReplaysAreBitIdenticalToEagerSteps) {
  // Five sequences with different prompts decode together; the batch shrinks from 5 (padded
  // to 8) to 3 (padded to 4) to 2, and a long prefill in between moves the activation
  // workspace, which must force fresh captures rather than replays into freed memory.
  const auto golden = LoadStoriesGolden();
  constexpr int kSeqs = 5;
  Runner eager(model_.weights.get(), &pool_, /*graphs=*/false, kSeqs + 1);
  Runner graph(model_.weights.get(), &pool_, /*graphs=*/true, kSeqs + 1);
  ASSERT_TRUE(graph.model().EnableDecodeGraphs(Options(8)).ok());

  std::vector<TokenId> next(kSeqs + 1);
  auto prefill = [&](int id, std::vector<TokenId> prompt) {
    const int ids[] = {id};
    const std::vector<std::vector<TokenId>> tokens = {std::move(prompt)};
    const std::vector<float> a = eager.Step(ids, tokens);
    const std::vector<float> b = graph.Step(ids, tokens);
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
    next[id] = ArgMax(a);
  };
  for (int s = 0; s < kSeqs; ++s) {
    std::vector<TokenId> prompt = golden.cases[s % golden.cases.size()].prompt_ids;
    prompt.resize(prompt.size() - (s / 2));  // distinct lengths and contents
    prompt.push_back(static_cast<TokenId>(10 + s));
    prefill(s, prompt);
  }
  auto decode = [&](std::vector<int> ids, int steps) {
    for (int step = 0; step < steps; ++step) {
      std::vector<std::vector<TokenId>> tokens;
      for (int id : ids) tokens.push_back({next[id]});
      const std::vector<float> a = eager.Step(ids, tokens);
      const std::vector<float> b = graph.Step(ids, tokens);
      ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
          << "batch " << ids.size() << ", step " << step;
      for (size_t i = 0; i < ids.size(); ++i) {
        next[ids[i]] = ArgMax(std::span<const float>(a).subspan(i * vocab_, vocab_));
      }
    }
  };
  decode({0, 1, 2, 3, 4}, 20);  // padded to 8
  decode({0, 2, 4}, 20);        // padded to 4
  EXPECT_EQ(graph.model().decode_graph_stats().captures, 2);
  EXPECT_EQ(graph.model().decode_graph_stats().replays, 38);  // 40 steps, 2 of them captures

  // A 64-token prefill grows the workspace past the 8 rows the graphs were captured with.
  std::vector<TokenId> long_prompt = golden.cases[0].prompt_ids;
  while (long_prompt.size() < 64) long_prompt.push_back(long_prompt[long_prompt.size() % 3]);
  prefill(kSeqs, long_prompt);
  decode({1, 3, kSeqs}, 10);  // padded to 4 again: captured anew
  decode({1, kSeqs}, 10);     // padded to 2: first capture
  const DecodeGraphStats& stats = graph.model().decode_graph_stats();
  EXPECT_EQ(stats.captures, 4);
  EXPECT_EQ(stats.replays, 56);  // 60 decode steps, 4 of them captures
  EXPECT_EQ(stats.eager_decodes, 0);
}

TEST_F(DecodeGraphTest, BatchesLargerThanTheLargestGraphRunEagerly) {
  Runner eager(model_.weights.get(), &pool_, /*graphs=*/false, 3);
  Runner graph(model_.weights.get(), &pool_, /*graphs=*/true, 3);
  ASSERT_TRUE(graph.model().EnableDecodeGraphs(Options(2)).ok());
  const int ids[] = {0, 1, 2};
  std::vector<std::vector<TokenId>> tokens = {{1, 50, 60}, {1, 70}, {1, 80, 90, 100}};
  for (int step = 0; step < 5; ++step) {
    const std::vector<float> a = eager.Step(ids, tokens);
    const std::vector<float> b = graph.Step(ids, tokens);
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
    for (int i = 0; i < 3; ++i) {
      tokens[i] = {ArgMax(std::span<const float>(a).subspan(i * vocab_, vocab_))};
    }
  }
  const DecodeGraphStats& stats = graph.model().decode_graph_stats();
  EXPECT_EQ(stats.captures, 0);
  EXPECT_EQ(stats.replays, 0);
  EXPECT_EQ(stats.eager_decodes, 4);  // the first step was a prefill
}

TEST_F(DecodeGraphTest, RefusesBackendsWithoutGraphsAndBadOptions) {
  Runner plain(model_.weights.get(), &pool_, /*graphs=*/false, 1);
  absl::Status s = plain.model().EnableDecodeGraphs(Options(4));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_FALSE(plain.model().decode_graphs_enabled());

  Runner graph(model_.weights.get(), &pool_, /*graphs=*/true, 1);
  DecodeGraphOptions bad = Options(0);
  EXPECT_EQ(graph.model().EnableDecodeGraphs(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = Options(4);
  bad.max_context_len = model_.config().max_position_embeddings + 1;
  s = graph.model().EnableDecodeGraphs(bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("max_context_len"), std::string::npos) << s;
  bad = Options(4);
  bad.block_table_stride = 0;
  EXPECT_EQ(graph.model().EnableDecodeGraphs(bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(graph.model().decode_graphs_enabled());
  EXPECT_TRUE(graph.model().EnableDecodeGraphs(Options(4)).ok());
  EXPECT_TRUE(graph.model().decode_graphs_enabled());
}

TEST(CpuBackendGraphTest, RecordsInsteadOfRunningAndRefusesBlockingCalls) {
  cpu::CpuBackend backend(nullptr, /*enable_graphs=*/true);
  float data[4] = {1, 2, 3, 4};
  ASSERT_TRUE(backend.BeginCapture().ok());
  EXPECT_EQ(backend.BeginCapture().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(backend.Memset(data, 0, sizeof(data)).ok());
  EXPECT_EQ(data[0], 1.0f);  // recorded, not run
  EXPECT_EQ(backend.Synchronize().code(), absl::StatusCode::kFailedPrecondition);
  float host[4];
  EXPECT_EQ(backend.CopyToHost(host, data, sizeof(host)).code(),
            absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<int> graph = backend.EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(data[0], 1.0f);
  ASSERT_TRUE(backend.LaunchGraph(*graph).ok());
  EXPECT_EQ(data[0], 0.0f);
  EXPECT_EQ(data[3], 0.0f);
  EXPECT_EQ(backend.LaunchGraph(*graph + 1).code(), absl::StatusCode::kInvalidArgument);
  backend.DestroyGraph(*graph);

  cpu::CpuBackend off(nullptr);
  EXPECT_FALSE(off.supports_graphs());
  EXPECT_EQ(off.BeginCapture().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kvserve
