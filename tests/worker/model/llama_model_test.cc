// The CPU forward pass against llama2.c's reference logits and greedy tokens (golden.json), on the
// same model stored as GGUF and as a Hugging Face directory.

#include "worker/model/llama_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_isa.h"
#include "tests/worker/model/golden.h"
#include "worker/model/batch_builder.h"
#include "worker/model/loaded_model.h"
#include "worker/model/synthetic_model.h"

namespace kvserve {
namespace {

using testing_golden::kStoriesGguf;
using testing_golden::kStoriesHf;
using testing_golden::LoadStoriesGolden;

constexpr int kBlockSize = 16;

// Says which CPU kernel path the golden comparisons ran on (llama_model_test_avx2 forces AVX2).
class ActiveIsaReport : public ::testing::Environment {
 public:
  void SetUp() override {
    std::printf("[ISA paths] golden model tests on: %s\n",
                std::string(cpu::CpuIsaName(cpu::ActiveCpuIsa())).c_str());
  }
};
::testing::Environment* const kActiveIsaReport =
    ::testing::AddGlobalTestEnvironment(new ActiveIsaReport);

// One sequence in a private cache, fed through the model chunk by chunk.
class SequenceRunner {
 public:
  SequenceRunner(const ModelWeights* weights, cpu::ThreadPool* pool, int block_size = kBlockSize)
      : block_size_(block_size) {
    model_ = *LlamaModel::Create(weights, pool);
    const int64_t max_len = weights->config.max_position_embeddings;
    const int64_t blocks = (max_len + block_size - 1) / block_size;
    cache_ = *KvCache::Create(weights->config, blocks, block_size);
    // Physical blocks in reverse order, so the test also exercises the block table.
    table_.resize(blocks);
    std::iota(table_.rbegin(), table_.rend(), 0);
  }

  // Feeds `tokens` after the current position; returns the logits of the last one.
  std::vector<float> Feed(std::span<const TokenId> tokens) {
    builder_.Clear();
    builder_.AddSequence(tokens, pos_, table_, block_size_, true);
    std::vector<float> logits(model_->config().vocab_size);
    absl::Status s = model_->Forward(builder_.Build(), *cache_, logits.data());
    EXPECT_TRUE(s.ok()) << s;
    pos_ += static_cast<int32_t>(tokens.size());
    return logits;
  }

  std::vector<TokenId> Greedy(std::span<const TokenId> prompt, int max_tokens) {
    std::vector<float> logits = Feed(prompt);
    std::vector<TokenId> out;
    for (int i = 0; i < max_tokens; ++i) {
      const TokenId next = static_cast<TokenId>(
          std::max_element(logits.begin(), logits.end()) - logits.begin());
      out.push_back(next);
      const TokenId one[] = {next};
      logits = Feed(one);
    }
    return out;
  }

 private:
  int block_size_;
  int32_t pos_ = 0;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<KvCache> cache_;
  std::vector<int32_t> table_;
  BatchBuilder builder_;
};

class StoriesTest : public ::testing::TestWithParam<const char*> {
 protected:
  static void SetUpTestSuite() { pool_ = new cpu::ThreadPool(2); }
  static void TearDownTestSuite() {
    delete pool_;
    pool_ = nullptr;
  }
  void SetUp() override {
    absl::StatusOr<LoadedModel> m = LoadModel(GetParam());
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
  }
  static cpu::ThreadPool* pool_;
  LoadedModel model_;
};
cpu::ThreadPool* StoriesTest::pool_ = nullptr;

TEST_P(StoriesTest, LogitsMatchReference) {
  const auto golden = LoadStoriesGolden();
  SequenceRunner runner(model_.weights.get(), pool_);
  std::vector<float> logits = runner.Feed(golden.probe_prompt_ids);
  ASSERT_EQ(logits.size(), golden.probe_logits.size());
  float max_diff = 0.0f;
  for (size_t i = 0; i < logits.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(logits[i] - golden.probe_logits[i]));
  }
  EXPECT_LT(max_diff, 1e-4f);
}

TEST_P(StoriesTest, GreedyTokensMatchReference) {
  const auto golden = LoadStoriesGolden();
  for (const auto& c : golden.cases) {
    SequenceRunner runner(model_.weights.get(), pool_);
    std::vector<TokenId> out =
        runner.Greedy(c.prompt_ids, static_cast<int>(c.generated_ids.size()));
    EXPECT_EQ(out, c.generated_ids) << c.prompt;
  }
}

TEST_P(StoriesTest, TokenByTokenEqualsPrefillBitForBit) {
  // The kernels keep each row's reduction order whatever the batch shape, so feeding the prompt
  // one token at a time, in uneven chunks, or all at once gives identical logits.
  const auto golden = LoadStoriesGolden();
  std::vector<TokenId> prompt = golden.cases[0].prompt_ids;
  prompt.insert(prompt.end(), golden.cases[0].generated_ids.begin(),
                golden.cases[0].generated_ids.begin() + 40);
  SequenceRunner whole(model_.weights.get(), pool_);
  const std::vector<float> expected = whole.Feed(prompt);
  SequenceRunner single(model_.weights.get(), pool_);
  std::vector<float> got;
  for (TokenId t : prompt) got = single.Feed(std::span<const TokenId>(&t, 1));
  EXPECT_EQ(0, std::memcmp(expected.data(), got.data(), expected.size() * sizeof(float)));
  SequenceRunner chunked(model_.weights.get(), pool_, /*block_size=*/1);
  std::span<const TokenId> rest(prompt);
  for (size_t chunk : {3u, 17u, 1u}) {
    got = chunked.Feed(rest.first(chunk));
    rest = rest.subspan(chunk);
  }
  got = chunked.Feed(rest);
  EXPECT_EQ(0, std::memcmp(expected.data(), got.data(), expected.size() * sizeof(float)));
}

INSTANTIATE_TEST_SUITE_P(Formats, StoriesTest, ::testing::Values(kStoriesGguf, kStoriesHf),
                         [](const auto& info) { return info.index == 0 ? "gguf" : "hf"; });

// The two files hold the same f32 weights; where one ties the output head to the embedding and
// the other stores it apart, the head is read in its stored layout on one side and packed on the
// other (the avx512 path packs f32 matmul weights, not an embedding), and the two sum each logit
// in different orders: 1.5e-5 apart at most over these 200 positions, hence 5e-5.
TEST(LlamaModelTest, GgufAndHfLogitsAgree) {
  cpu::ThreadPool pool(1);
  LoadedModel gguf = *LoadModel(kStoriesGguf);
  LoadedModel hf = *LoadModel(kStoriesHf);
  const auto golden = LoadStoriesGolden();
  for (const auto& c : golden.cases) {
    std::vector<TokenId> tokens = c.prompt_ids;
    tokens.insert(tokens.end(), c.generated_ids.begin(), c.generated_ids.end());
    SequenceRunner a(gguf.weights.get(), &pool);
    SequenceRunner b(hf.weights.get(), &pool);
    for (size_t start = 0; start < tokens.size(); start += 50) {
      const size_t n = std::min<size_t>(50, tokens.size() - start);
      std::span<const TokenId> chunk(tokens.data() + start, n);
      std::vector<float> la = a.Feed(chunk);
      std::vector<float> lb = b.Feed(chunk);
      for (size_t i = 0; i < la.size(); ++i) {
        ASSERT_NEAR(la[i], lb[i], 5e-5f * std::max(1.0f, std::fabs(la[i])))
            << "position " << start + n - 1 << " logit " << i;
      }
    }
  }
}

TEST(LlamaModelTest, RejectsBadBatches) {
  cpu::ThreadPool pool(1);
  LoadedModel m = *LoadModel(kStoriesGguf);
  SequenceRunner runner(m.weights.get(), &pool);
  std::unique_ptr<LlamaModel> model = *LlamaModel::Create(m.weights.get(), &pool);
  std::unique_ptr<KvCache> cache = *KvCache::Create(m.config(), 4, kBlockSize);
  std::vector<float> logits(m.config().vocab_size);
  const std::vector<int32_t> table = {0, 1};
  BatchBuilder b;
  const TokenId bad_token[] = {1, 9999};
  b.AddSequence(bad_token, 0, table, kBlockSize, true);
  absl::Status s = model->Forward(b.Build(), *cache, logits.data());
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("9999"), std::string::npos) << s;
  // Position 40 needs a third block the table does not have.
  b.Clear();
  const TokenId ok_token[] = {5};
  b.AddSequence(ok_token, 40, table, kBlockSize, true);
  EXPECT_TRUE(absl::IsInvalidArgument(model->Forward(b.Build(), *cache, logits.data())));
}

TEST(LlamaModelTest, Llama3RopeScalingKeepsHighFrequencies) {
  ModelConfig c;
  c.head_dim = 128;
  c.rope_theta = 500000.0f;
  c.rope_scaling = {RopeScaling::Type::kLlama3, 8.0f, 1.0f, 4.0f, 8192};
  const std::vector<float> scaled = ComputeRopeInvFreq(c, TensorView{});
  c.rope_scaling = {};
  const std::vector<float> plain = ComputeRopeInvFreq(c, TensorView{});
  // Wavelength 2*pi/f below 8192/4 = 2048 tokens: unchanged; above 8192: divided by 8.
  EXPECT_EQ(scaled[0], plain[0]);
  EXPECT_FLOAT_EQ(scaled[63], plain[63] / 8.0f);
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_LE(scaled[i], plain[i]);
    EXPECT_GE(scaled[i], plain[i] / 8.0f * (1 - 1e-6f));
  }
}

}  // namespace
}  // namespace kvserve
