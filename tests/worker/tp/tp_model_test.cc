// Tensor-parallel CPU ranks: tp 1, 2, 4 and 8 give the reference greedy tokens on stories260K
// and the same tokens as tp 1 on synthetic models (8 kv heads, q8_0, q/k/v biases); logits stay
// within float tolerance of tp 1 and are bit-reproducible run to run.

#include "worker/tp/tp_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/model/golden.h"
#include "worker/model/batch_builder.h"
#include "worker/model/loaded_model.h"
#include "worker/model/synthetic_model.h"

namespace kvserve {
namespace {

using testing_golden::kStoriesGguf;
using testing_golden::LoadStoriesGolden;

constexpr int kBlockSize = 16;

std::unique_ptr<TensorParallelModel> MakeTp(const ModelWeights* weights, int tp) {
  TensorParallelOptions options;
  options.tp_size = tp;
  options.num_threads = tp;  // one kernel thread per rank
  absl::StatusOr<std::unique_ptr<TensorParallelModel>> m =
      TensorParallelModel::Create(weights, options);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

// One sequence in a private sharded cache, fed chunk by chunk.
class TpRunner {
 public:
  TpRunner(const ModelWeights* weights, int tp) : model_(MakeTp(weights, tp)) {
    const int64_t max_len = weights->config.max_position_embeddings;
    const int64_t blocks = (max_len + kBlockSize - 1) / kBlockSize;
    cache_ = *model_->CreateKvCache(blocks, kBlockSize);
    // Physical blocks in reverse order, so the block table is exercised too.
    table_.resize(blocks);
    std::iota(table_.rbegin(), table_.rend(), 0);
  }

  std::vector<float> Feed(std::span<const TokenId> tokens) {
    builder_.Clear();
    builder_.AddSequence(tokens, pos_, table_, kBlockSize, true);
    std::vector<float> logits(model_->config().vocab_size);
    absl::Status s = model_->Forward(builder_.Build(), *cache_, logits.data());
    EXPECT_TRUE(s.ok()) << s;
    pos_ += static_cast<int32_t>(tokens.size());
    return logits;
  }

  // Greedy decoding; `all_logits` (if given) collects the logits of every step.
  std::vector<TokenId> Greedy(std::span<const TokenId> prompt, int max_tokens,
                              std::vector<std::vector<float>>* all_logits = nullptr) {
    std::vector<float> logits = Feed(prompt);
    std::vector<TokenId> out;
    for (int i = 0; i < max_tokens; ++i) {
      if (all_logits != nullptr) all_logits->push_back(logits);
      const TokenId next =
          static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      out.push_back(next);
      const TokenId one[] = {next};
      logits = Feed(one);
    }
    return out;
  }

  TensorParallelModel& model() { return *model_; }

 private:
  std::unique_ptr<TensorParallelModel> model_;
  std::unique_ptr<ShardedKvCache> cache_;
  std::vector<int32_t> table_;
  BatchBuilder builder_;
  int32_t pos_ = 0;
};

float MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  float d = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

float MaxAbs(const std::vector<float>& a) {
  float m = 0.0f;
  for (float x : a) m = std::max(m, std::fabs(x));
  return m;
}

TEST(TpStoriesTest, GreedyTokensMatchReferenceAtEveryTp) {
  LoadedModel model = *LoadModel(kStoriesGguf);
  const auto golden = LoadStoriesGolden();
  for (int tp : {1, 2, 4, 8}) {
    for (const auto& c : golden.cases) {
      TpRunner runner(model.weights.get(), tp);
      std::vector<TokenId> out =
          runner.Greedy(c.prompt_ids, static_cast<int>(c.generated_ids.size()));
      EXPECT_EQ(out, c.generated_ids) << "tp " << tp << ": " << c.prompt;
    }
  }
}

TEST(TpStoriesTest, ProbeLogitsCloseToTpOneAndReference) {
  LoadedModel model = *LoadModel(kStoriesGguf);
  const auto golden = LoadStoriesGolden();
  const std::vector<float> base = TpRunner(model.weights.get(), 1).Feed(golden.probe_prompt_ids);
  for (int tp : {2, 4, 8}) {
    const std::vector<float> got = TpRunner(model.weights.get(), tp).Feed(golden.probe_prompt_ids);
    // The all-reduce sums partial products in another order than one matmul: close, not equal.
    EXPECT_LT(MaxAbsDiff(got, base), 1e-4f) << "tp " << tp;
    EXPECT_LT(MaxAbsDiff(got, golden.probe_logits), 1e-4f) << "tp " << tp;
    // Reproducible: the same tp gives the same bits.
    const std::vector<float> again =
        TpRunner(model.weights.get(), tp).Feed(golden.probe_prompt_ids);
    EXPECT_EQ(0, std::memcmp(got.data(), again.data(), got.size() * 4)) << "tp " << tp;
  }
}

TEST(TpStoriesTest, KvCachePerRankAndBytes) {
  LoadedModel model = *LoadModel(kStoriesGguf);
  auto tp1 = MakeTp(model.weights.get(), 1);
  auto tp4 = MakeTp(model.weights.get(), 4);
  auto tp8 = MakeTp(model.weights.get(), 8);
  // 5 layers x K,V x kv_heads x head_dim 8 x 4 bytes.
  EXPECT_EQ(tp1->KvBytesPerToken(KvCacheDType::kF32), 5 * 2 * 4 * 8 * 4);
  EXPECT_EQ(tp4->KvBytesPerToken(KvCacheDType::kF32), 5 * 2 * 4 * 8 * 4);
  EXPECT_EQ(tp8->KvBytesPerToken(KvCacheDType::kF32), 2 * 5 * 2 * 4 * 8 * 4);  // replicated x2
  auto cache = *tp8->CreateKvCache(10, 4, KvCacheDType::kInt8);
  EXPECT_EQ(cache->tp_size(), 8);
  EXPECT_EQ(cache->num_blocks(), 10);
  EXPECT_EQ(cache->block_size(), 4);
  EXPECT_EQ(cache->dtype(), KvCacheDType::kInt8);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(cache->rank(r).layout().num_kv_heads, 1);
  EXPECT_EQ(tp8->rank_config(3).num_heads, 1);
  EXPECT_EQ(tp8->plan(3).kv_head_begin, 1);
  EXPECT_EQ(tp8->config().num_heads, 8);  // the whole model's config
}

TEST(TpStoriesTest, CopyBlockAppliesToEveryRank) {
  LoadedModel model = *LoadModel(kStoriesGguf);
  auto tp = MakeTp(model.weights.get(), 2);
  auto cache = *tp->CreateKvCache(4, kBlockSize);
  // Fill block 1 with a prompt's K/V.
  std::vector<TokenId> prompt(kBlockSize);
  for (int i = 0; i < kBlockSize; ++i) prompt[i] = 10 + i;
  BatchBuilder builder;
  const int32_t table[] = {1};
  builder.AddSequence(prompt, 0, table, kBlockSize, true);
  std::vector<float> logits(model.config().vocab_size);
  ASSERT_TRUE(tp->Forward(builder.Build(), *cache, logits.data()).ok());
  cache->CopyBlock(1, 3);
  for (int r = 0; r < 2; ++r) {
    const KvCache& c = cache->rank(r);
    const int64_t block_bytes = c.layout().num_kv_heads * kBlockSize * c.layout().head_dim * 4;
    for (int layer = 0; layer < c.num_layers(); ++layer) {
      const auto* k = static_cast<const uint8_t*>(c.k(layer).data);
      const auto* v = static_cast<const uint8_t*>(c.v(layer).data);
      EXPECT_EQ(0, std::memcmp(k + 3 * block_bytes, k + 1 * block_bytes, block_bytes));
      EXPECT_EQ(0, std::memcmp(v + 3 * block_bytes, v + 1 * block_bytes, block_bytes));
      // Written, not just zeros copied over zeros.
      std::vector<uint8_t> zeros(block_bytes, 0);
      EXPECT_NE(0, std::memcmp(k + block_bytes, zeros.data(), block_bytes));
    }
  }
}

TEST(TpStoriesTest, BadBatchFailsOnEveryRankWithoutHanging) {
  LoadedModel model = *LoadModel(kStoriesGguf);
  auto tp = MakeTp(model.weights.get(), 4);
  auto cache = *tp->CreateKvCache(4, kBlockSize);
  BatchBuilder builder;
  const int32_t table[] = {1};
  const TokenId bad[] = {3, 100000};
  builder.AddSequence(bad, 0, table, kBlockSize, true);
  std::vector<float> logits(model.config().vocab_size);
  absl::Status s = tp->Forward(builder.Build(), *cache, logits.data());
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("token id 100000"), std::string::npos) << s;
  // The model still works afterwards.
  builder.Clear();
  const TokenId good[] = {3, 4};
  builder.AddSequence(good, 0, table, kBlockSize, true);
  EXPECT_TRUE(tp->Forward(builder.Build(), *cache, logits.data()).ok());
  // A cache made for another tp.
  auto other = *MakeTp(model.weights.get(), 2)->CreateKvCache(4, kBlockSize);
  EXPECT_TRUE(absl::IsInvalidArgument(tp->Forward(builder.Build(), *other, logits.data())));
}

TEST(TpStoriesTest, CreateRejectsImpossibleSplits) {
  LoadedModel model = *LoadModel(kStoriesGguf);
  TensorParallelOptions options;
  options.tp_size = 3;
  absl::StatusOr<std::unique_ptr<TensorParallelModel>> m =
      TensorParallelModel::Create(model.weights.get(), options);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("does not divide num_heads 8"), std::string::npos);
  options.tp_size = 0;
  EXPECT_TRUE(
      absl::IsInvalidArgument(TensorParallelModel::Create(model.weights.get(), options).status()));
}

// Adds random f32 q/k/v biases (Qwen2-style) to a synthetic model.
void AddQkvBias(ModelWeights& w, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> dist(-0.5f, 0.5f);
  auto make = [&](int64_t n) {
    auto* f = reinterpret_cast<float*>(w.Allocate(n * 4));
    for (int64_t i = 0; i < n; ++i) f[i] = dist(rng);
    return TensorView{"bias", DType::kF32, {n}, f};
  };
  const ModelConfig& c = w.config;
  for (LayerWeights& l : w.layers) {
    l.bq = make(int64_t{c.num_heads} * c.head_dim);
    l.bk = make(int64_t{c.num_kv_heads} * c.head_dim);
    l.bv = make(int64_t{c.num_kv_heads} * c.head_dim);
  }
  w.config.qkv_bias = true;
}

struct SyntheticCase {
  const char* name;
  SyntheticModelOptions options;
  std::vector<int> tps;
  bool qkv_bias = false;
};

class TpSyntheticTest : public ::testing::TestWithParam<SyntheticCase> {};

TEST_P(TpSyntheticTest, GreedyTokensEqualTpOne) {
  const SyntheticCase& param = GetParam();
  auto weights = *MakeSyntheticModel(param.options);
  if (param.qkv_bias) AddQkvBias(*weights, 7);
  std::vector<TokenId> prompt;
  for (int i = 0; i < 23; ++i) prompt.push_back((i * 37 + 5) % param.options.vocab_size);
  constexpr int kTokens = 24;
  std::vector<std::vector<float>> base_logits;
  const std::vector<TokenId> base =
      TpRunner(weights.get(), 1).Greedy(prompt, kTokens, &base_logits);
  // A random model's greedy output should not be one repeated token, or the test is weak.
  EXPECT_GT(std::set<TokenId>(base.begin(), base.end()).size(), 3u);
  for (int tp : param.tps) {
    std::vector<std::vector<float>> logits;
    const std::vector<TokenId> got = TpRunner(weights.get(), tp).Greedy(prompt, kTokens, &logits);
    EXPECT_EQ(got, base) << "tp " << tp;
    for (size_t i = 0; i < logits.size() && i < base_logits.size(); ++i) {
      // Quantized weights multiply int8-quantized activations (kernels/cpu/matmul_impl.h): the
      // float-order differences of tp's partial sums can flip an activation's rounding, which
      // moves that product by up to a quantization step (1/254 of its block's largest value), so
      // logits agree to ~1e-3 there rather than to float rounding; the tokens stay equal.
      const float rel = DTypeIsQuantized(param.options.dtype) ? 1e-2f : 1e-4f;
      const float tol = rel * std::max(1.0f, MaxAbs(base_logits[i]));
      ASSERT_LT(MaxAbsDiff(logits[i], base_logits[i]), tol) << "tp " << tp << " step " << i;
    }
  }
}

SyntheticModelOptions Synth(int heads, int kv_heads, int hidden, int inter, DType dtype,
                            uint64_t seed = 11) {
  SyntheticModelOptions o;
  o.num_layers = 2;
  o.num_heads = heads;
  o.num_kv_heads = kv_heads;
  o.hidden_size = hidden;
  o.intermediate_size = inter;
  o.vocab_size = 256;
  o.max_position_embeddings = 128;
  o.dtype = dtype;
  o.seed = seed;
  return o;
}

INSTANTIATE_TEST_SUITE_P(Models, TpSyntheticTest,
                         ::testing::Values(
                             // 8 kv heads (no GQA): tp 8 gives each rank one query and one kv head.
                             SyntheticCase{"kv8", Synth(8, 8, 256, 688, DType::kF32), {2, 4, 8}},
                             // GQA 4:1 with 2 kv heads: tp 4 and 8 replicate kv heads.
                             SyntheticCase{"gqa", Synth(8, 2, 128, 200, DType::kF32), {2, 4, 8}},
                             // Quantized weights: column cuts on 32-element block boundaries.
                             SyntheticCase{"q8_0", Synth(8, 8, 256, 512, DType::kQ8_0), {2, 4, 8}},
                             SyntheticCase{
                                 "f16_bias", Synth(4, 4, 128, 160, DType::kF16, 3), {2, 4}, true}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(TpBatchTest, MixedBatchMatchesTpOneAndIsReproducible) {
  auto weights = *MakeSyntheticModel(Synth(8, 8, 256, 688, DType::kF32));
  // Two sequences in one batch: a 37-token prefill and a 5-token chunk of a second sequence
  // whose first 20 tokens were cached by an earlier step.
  auto run = [&](int tp) {
    auto model = MakeTp(weights.get(), tp);
    auto cache = *model->CreateKvCache(16, kBlockSize);
    std::vector<TokenId> a(37), b(25);
    for (int i = 0; i < 37; ++i) a[i] = (i * 13 + 1) % 256;
    for (int i = 0; i < 25; ++i) b[i] = (i * 29 + 3) % 256;
    const int32_t table_a[] = {5, 2, 9};
    const int32_t table_b[] = {7, 1};
    std::vector<float> logits(2 * 256);
    BatchBuilder builder;
    builder.AddSequence(std::span<const TokenId>(b).first(20), 0, table_b, kBlockSize, false);
    EXPECT_TRUE(model->Forward(builder.Build(), *cache, logits.data()).ok());
    builder.Clear();
    builder.AddSequence(a, 0, table_a, kBlockSize, true);
    builder.AddSequence(std::span<const TokenId>(b).subspan(20), 20, table_b, kBlockSize, true);
    EXPECT_TRUE(model->Forward(builder.Build(), *cache, logits.data()).ok());
    return logits;
  };
  const std::vector<float> base = run(1);
  for (int tp : {2, 4, 8}) {
    const std::vector<float> got = run(tp);
    EXPECT_LT(MaxAbsDiff(got, base), 1e-4f * std::max(1.0f, MaxAbs(base))) << "tp " << tp;
    const std::vector<float> again = run(tp);
    EXPECT_EQ(0, std::memcmp(got.data(), again.data(), got.size() * 4)) << "tp " << tp;
  }
}

}  // namespace
}  // namespace kvserve
