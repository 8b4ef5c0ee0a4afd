// Pipeline stages in one process: a model split into stages (StageWeights, each stage a
// TensorParallelModel) and run stage after stage through the hand-over gives the whole model's
// logits bit for bit, on stories260K (and its reference greedy tokens) and on synthetic dense,
// MoE and MLA models whose per-layer rules depend on the absolute layer index; stages are
// tensor-parallel inside. Also StageWeights' refusals and what each stage holds.

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/model/golden.h"
#include "worker/model/batch_builder.h"
#include "worker/model/loaded_model.h"
#include "worker/model/synthetic_model.h"
#include "worker/planner/pipeline_layout.h"
#include "worker/tp/shard.h"
#include "worker/tp/tp_model.h"

namespace kvserve {
namespace {

using testing_golden::kStoriesGguf;
using testing_golden::LoadStoriesGolden;

constexpr int kBlockSize = 16;

std::unique_ptr<TensorParallelModel> MakeTp(const ModelWeights* weights, int tp) {
  TensorParallelOptions options;
  options.tp_size = tp;
  options.num_threads = tp;
  absl::StatusOr<std::unique_ptr<TensorParallelModel>> m =
      TensorParallelModel::Create(weights, options);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

// Two sequences fed side by side through either the whole model or a chain of stages, each
// with its own caches over one block table layout (reversed physical blocks).
class Chain {
 public:
  // `counts` empty: the whole model; else the layers of each stage.
  Chain(const ModelWeights& weights, std::vector<int> counts, int tp) : weights_(weights) {
    if (counts.empty()) {
      models_.push_back(MakeTp(&weights, tp));
    } else {
      absl::StatusOr<std::vector<StageLayers>> stages =
          SplitLayers(weights.config.num_layers, static_cast<int>(counts.size()), counts);
      EXPECT_TRUE(stages.ok()) << stages.status();
      for (const StageLayers& s : *stages) {
        absl::StatusOr<std::unique_ptr<ModelWeights>> w = StageWeights(weights, s.first, s.count);
        EXPECT_TRUE(w.ok()) << w.status();
        stage_weights_.push_back(std::move(*w));
        models_.push_back(MakeTp(stage_weights_.back().get(), tp));
      }
    }
    const int64_t per_seq = (weights.config.max_position_embeddings + kBlockSize - 1) / kBlockSize;
    blocks_ = 2 * per_seq + 1;
    for (auto& m : models_) caches_.push_back(*m->CreateKvCache(blocks_, kBlockSize));
    for (int s = 0; s < 2; ++s) {
      tables_[s].resize(per_seq);
      // Sequence s gets blocks from the top down, interleaved with the other.
      for (int64_t i = 0; i < per_seq; ++i)
        tables_[s][i] = static_cast<int32_t>(blocks_ - 1 - 2 * i - s);
    }
  }

  // Feeds tokens[s] to sequence s (both want logits); returns [2, vocab] logits.
  std::vector<float> Feed(const std::vector<TokenId> (&tokens)[2]) {
    builder_.Clear();
    for (int s = 0; s < 2; ++s) {
      builder_.AddSequence(tokens[s], pos_[s], tables_[s], kBlockSize, true);
    }
    const ForwardBatch batch = builder_.Build();
    const int64_t vocab = weights_.config.vocab_size;
    std::vector<float> logits(2 * vocab);
    std::vector<float> hand_over;
    std::vector<float> next;
    for (size_t i = 0; i < models_.size(); ++i) {
      const bool last = i + 1 == models_.size();
      if (!last) {
        next.assign(static_cast<size_t>(StageIoFloats(static_cast<int64_t>(batch.tokens.size()),
                                                      weights_.config.hidden_size)),
                    -1.0f);
      }
      absl::Status s = models_[i]->Forward(
          batch, *caches_[i], last ? logits.data() : nullptr,
          StageIo{i == 0 ? nullptr : hand_over.data(), last ? nullptr : next.data()});
      EXPECT_TRUE(s.ok()) << "stage " << i << ": " << s;
      hand_over.swap(next);
    }
    for (int s = 0; s < 2; ++s) pos_[s] += static_cast<int32_t>(tokens[s].size());
    return logits;
  }

  // Greedy decoding of two prompts together for `steps` steps; returns every step's logits.
  std::vector<std::vector<float>> Run(const std::vector<TokenId> (&prompts)[2], int steps) {
    std::vector<std::vector<float>> all;
    std::vector<TokenId> feed[2] = {prompts[0], prompts[1]};
    const size_t vocab = static_cast<size_t>(weights_.config.vocab_size);
    for (int i = 0; i <= steps; ++i) {
      all.push_back(Feed(feed));
      for (int s = 0; s < 2; ++s) {
        const float* row = all.back().data() + s * vocab;
        feed[s] = {static_cast<TokenId>(std::max_element(row, row + vocab) - row)};
      }
    }
    return all;
  }

 private:
  const ModelWeights& weights_;
  std::vector<std::unique_ptr<ModelWeights>> stage_weights_;
  std::vector<std::unique_ptr<TensorParallelModel>> models_;
  std::vector<std::unique_ptr<ShardedKvCache>> caches_;
  int64_t blocks_ = 0;
  std::vector<int32_t> tables_[2];
  int32_t pos_[2] = {0, 0};
  BatchBuilder builder_;
};

std::vector<TokenId> PromptOf(int length, int first, int vocab) {
  std::vector<TokenId> p(static_cast<size_t>(length));
  for (int i = 0; i < length; ++i) p[i] = static_cast<TokenId>((first + 7 * i) % (vocab - 3) + 3);
  return p;
}

void ExpectSameLogits(const ModelWeights& weights, const std::vector<int>& counts, int tp,
                      const std::string& what) {
  const int vocab = weights.config.vocab_size;
  const std::vector<TokenId> prompts[2] = {PromptOf(37, 5, vocab), PromptOf(19, 11, vocab)};
  const std::vector<std::vector<float>> whole = Chain(weights, {}, tp).Run(prompts, 6);
  const std::vector<std::vector<float>> split = Chain(weights, counts, tp).Run(prompts, 6);
  ASSERT_EQ(whole.size(), split.size());
  for (size_t step = 0; step < whole.size(); ++step) {
    ASSERT_EQ(whole[step].size(), split[step].size());
    EXPECT_EQ(
        std::memcmp(whole[step].data(), split[step].data(), whole[step].size() * sizeof(float)), 0)
        << what << ": logits differ at step " << step;
  }
}

TEST(PipelineStageTest, StoriesSplitsGiveTheWholeModelsLogitsBitForBit) {
  LoadedModel model = *LoadModel(kStoriesGguf);
  ASSERT_EQ(model.config().num_layers, 5);
  for (const std::vector<int>& counts :
       {std::vector<int>{3, 2}, std::vector<int>{1, 4}, std::vector<int>{1, 1, 1, 1, 1}}) {
    for (int tp : {1, 2}) {
      ExpectSameLogits(*model.weights, counts, tp,
                       "stories260K " + std::to_string(counts.size()) + " stages, tp " +
                           std::to_string(tp) + ", first stage " + std::to_string(counts[0]));
    }
  }
}

TEST(PipelineStageTest, StoriesStagesGiveTheReferenceGreedyTokens) {
  LoadedModel model = *LoadModel(kStoriesGguf);
  const auto golden = LoadStoriesGolden();
  const int vocab = model.config().vocab_size;
  for (const auto& c : golden.cases) {
    Chain chain(*model.weights, {3, 2}, 1);
    // Sequence 1 runs the same prompt: both rows must agree with the reference.
    std::vector<TokenId> feed[2] = {c.prompt_ids, c.prompt_ids};
    std::vector<TokenId> out;
    for (size_t i = 0; i < c.generated_ids.size(); ++i) {
      const std::vector<float> logits = chain.Feed(feed);
      const TokenId next = static_cast<TokenId>(
          std::max_element(logits.begin(), logits.begin() + vocab) - logits.begin());
      out.push_back(next);
      feed[0] = feed[1] = {next};
    }
    EXPECT_EQ(out, c.generated_ids) << c.prompt;
  }
}

TEST(PipelineStageTest, SyntheticModelsSplitBitForBit) {
  struct Case {
    std::string name;
    SyntheticModelOptions options;
    std::vector<int> counts;
  };
  std::vector<Case> cases;
  {
    SyntheticModelOptions o;
    o.num_layers = 5;
    o.num_kv_heads = 2;
    o.intermediate_size = 512;
    o.dtype = DType::kQ8_0;
    o.tie_word_embeddings = true;  // the last stage needs the embedding for its output layer
    cases.push_back({"llama q8_0 tied", o, {2, 3}});
  }
  {
    // Dense first layer, then experts: the second stage's layers are all MoE, and one split
    // puts the dense layer alone on stage 0.
    SyntheticModelOptions o;
    o.architecture = "deepseek_v3";
    o.num_layers = 4;
    o.hidden_size = 128;
    o.num_heads = 4;
    o.intermediate_size = 256;
    o.moe_intermediate_size = 64;
    o.num_experts = 8;
    o.num_experts_per_tok = 2;
    o.n_group = 2;
    o.topk_group = 1;
    o.first_k_dense_replace = 2;
    o.kv_lora_rank = 32;
    o.qk_nope_head_dim = 16;
    o.qk_rope_head_dim = 8;
    o.v_head_dim = 16;
    o.vocab_size = 512;
    cases.push_back({"deepseek_v3 MLA + MoE, dense layers 0-1", o, {1, 3}});
    cases.push_back({"deepseek_v3 MLA + MoE, 3 stages", o, {2, 1, 1}});
  }
  {
    SyntheticModelOptions o;
    o.architecture = "qwen3_moe";
    o.num_layers = 3;
    o.hidden_size = 128;
    o.num_heads = 4;
    o.num_kv_heads = 2;
    o.intermediate_size = 256;
    o.moe_intermediate_size = 64;
    o.vocab_size = 512;
    cases.push_back({"qwen3_moe", o, {2, 1}});
  }
  for (const Case& c : cases) {
    absl::StatusOr<std::unique_ptr<ModelWeights>> w = MakeSyntheticModel(c.options);
    ASSERT_TRUE(w.ok()) << c.name << ": " << w.status();
    for (int tp : {1, 2}) {
      ExpectSameLogits(**w, c.counts, tp, c.name + ", tp " + std::to_string(tp));
    }
  }
}

TEST(PipelineStageTest, StageWeightsHoldTheirLayersAndEnds) {
  SyntheticModelOptions o;
  o.num_layers = 4;
  std::unique_ptr<ModelWeights> w = *MakeSyntheticModel(o);
  std::unique_ptr<ModelWeights> first = *StageWeights(*w, 0, 1);
  std::unique_ptr<ModelWeights> middle = *StageWeights(*w, 1, 2);
  std::unique_ptr<ModelWeights> last = *StageWeights(*w, 3, 1);
  EXPECT_TRUE(first->config.first_stage());
  EXPECT_FALSE(first->config.last_stage());
  EXPECT_TRUE(first->token_embedding.present());
  EXPECT_FALSE(first->output.present());
  EXPECT_FALSE(middle->token_embedding.present());
  EXPECT_FALSE(middle->output.present());
  EXPECT_FALSE(middle->final_norm.present());
  EXPECT_EQ(middle->config.num_layers, 2);
  EXPECT_EQ(middle->config.layer_offset, 1);
  EXPECT_EQ(middle->config.total_layers, 4);
  EXPECT_EQ(middle->layers[0].wq.data, w->layers[1].wq.data);  // views, not copies
  EXPECT_FALSE(last->token_embedding.present());               // untied: the output layer only
  EXPECT_TRUE(last->output.present());
  EXPECT_TRUE(last->config.last_stage());

  for (auto [begin, count] : {std::pair{-1, 2}, {0, 0}, {3, 2}, {4, 1}}) {
    absl::StatusOr<std::unique_ptr<ModelWeights>> bad = StageWeights(*w, begin, count);
    EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << begin << "+" << count;
  }
  EXPECT_TRUE(absl::IsInvalidArgument(StageWeights(*middle, 0, 1).status()));
}

TEST(PipelineStageTest, StagesRefuseMissingHandOverAndLogitsOnMiddleStages) {
  SyntheticModelOptions o;
  o.num_layers = 3;
  std::unique_ptr<ModelWeights> w = *MakeSyntheticModel(o);
  std::unique_ptr<ModelWeights> second = *StageWeights(*w, 1, 1);
  std::unique_ptr<TensorParallelModel> model = MakeTp(second.get(), 1);
  std::unique_ptr<ShardedKvCache> cache = *model->CreateKvCache(4, kBlockSize);
  BatchBuilder builder;
  const std::vector<TokenId> tokens = {5, 6, 7};
  const std::vector<int32_t> table = {1};
  builder.AddSequence(tokens, 0, table, kBlockSize, true);
  std::vector<float> logits(o.vocab_size);
  std::vector<float> io(static_cast<size_t>(StageIoFloats(3, o.hidden_size)));
  absl::Status no_input =
      model->Forward(builder.Build(), *cache, nullptr, StageIo{nullptr, io.data()});
  EXPECT_TRUE(absl::IsInvalidArgument(no_input)) << no_input;
  absl::Status logits_asked =
      model->Forward(builder.Build(), *cache, logits.data(), StageIo{io.data(), nullptr});
  EXPECT_TRUE(absl::IsInvalidArgument(logits_asked)) << logits_asked;
}

}  // namespace
}  // namespace kvserve
