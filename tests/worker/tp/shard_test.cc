// Weight sharding for tensor parallelism: ranges, shapes, zero-copy row views, copied column
// slices, replicated kv heads, quantization-block boundaries and the errors.

#include "worker/tp/shard.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/model/loaded_model.h"
#include "worker/model/synthetic_model.h"

namespace kvserve {
namespace {

constexpr char kStoriesGguf[] = KVSERVE_SHARED_DIR "/models/stories260K/stories260K.gguf";

const uint8_t* Bytes(const TensorView& t) { return static_cast<const uint8_t*>(t.data); }

float At(const TensorView& t, int64_t row, int64_t col) {
  return static_cast<const float*>(t.data)[row * t.shape[1] + col];
}

class StoriesShardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<LoadedModel> m = LoadModel(kStoriesGguf);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    // The numbers below are those of stories260K (see shared/models/stories260K/README.md).
    const ModelConfig& c = model_.config();
    ASSERT_EQ(c.num_heads, 8);
    ASSERT_EQ(c.num_kv_heads, 4);
    ASSERT_EQ(c.head_dim, 8);
    ASSERT_EQ(c.intermediate_size, 172);
    ASSERT_EQ(model_.weights->layers[0].wq.dtype, DType::kF32);
  }
  const ModelWeights& full() const { return *model_.weights; }
  LoadedModel model_;
};

TEST_F(StoriesShardTest, PlansSplitHeadsAndMlpRows) {
  struct Expected {
    int tp, rank, q_begin, q_end, kv_begin, kv_end;
    int64_t ffn_begin, ffn_end;
    bool replicated;
  };
  const Expected cases[] = {
      {1, 0, 0, 8, 0, 4, 0, 172, false},
      {2, 0, 0, 4, 0, 2, 0, 86, false},
      {2, 1, 4, 8, 2, 4, 86, 172, false},
      {4, 1, 2, 4, 1, 2, 43, 86, false},
      {4, 3, 6, 8, 3, 4, 129, 172, false},
      // tp 8 > 4 kv heads: ranks 2k and 2k+1 share kv head k.
      {8, 0, 0, 1, 0, 1, 0, 21, true},
      {8, 1, 1, 2, 0, 1, 21, 43, true},
      {8, 5, 5, 6, 2, 3, 107, 129, true},
      {8, 7, 7, 8, 3, 4, 150, 172, true},
  };
  for (const Expected& e : cases) {
    SCOPED_TRACE(testing::Message() << "tp " << e.tp << " rank " << e.rank);
    absl::StatusOr<ShardPlan> p = PlanShard(full(), e.rank, e.tp);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->q_head_begin, e.q_begin);
    EXPECT_EQ(p->q_head_end, e.q_end);
    EXPECT_EQ(p->kv_head_begin, e.kv_begin);
    EXPECT_EQ(p->kv_head_end, e.kv_end);
    EXPECT_EQ(p->ffn_begin, e.ffn_begin);
    EXPECT_EQ(p->ffn_end, e.ffn_end);
    EXPECT_EQ(p->kv_replicated, e.replicated);
  }
}

TEST_F(StoriesShardTest, MlpRowsCoverTheLayerExactlyOnce) {
  for (int tp : {1, 2, 4, 8}) {
    int64_t next = 0;
    for (int r = 0; r < tp; ++r) {
      ShardPlan p = *PlanShard(full(), r, tp);
      EXPECT_EQ(p.ffn_begin, next);
      EXPECT_GT(p.ffn_end, p.ffn_begin);
      next = p.ffn_end;
    }
    EXPECT_EQ(next, 172);
  }
}

TEST_F(StoriesShardTest, ShardShapesViewsAndCopies) {
  const int64_t hd = 8, hidden = 64;
  for (int tp : {2, 4, 8}) {
    for (int r = 0; r < tp; ++r) {
      SCOPED_TRACE(testing::Message() << "tp " << tp << " rank " << r);
      const ShardPlan plan = *PlanShard(full(), r, tp);
      absl::StatusOr<std::unique_ptr<ModelWeights>> shard = ShardWeights(full(), r, tp);
      ASSERT_TRUE(shard.ok()) << shard.status();
      const ModelConfig& c = (*shard)->config;
      EXPECT_EQ(c.num_heads, 8 / tp);
      EXPECT_EQ(c.num_kv_heads, tp <= 4 ? 4 / tp : 1);
      EXPECT_EQ(c.intermediate_size, plan.ffn_end - plan.ffn_begin);
      EXPECT_EQ(c.hidden_size, hidden);
      EXPECT_EQ(c.head_dim, hd);
      EXPECT_EQ(c.vocab_size, full().config.vocab_size);
      EXPECT_TRUE(c.Validate().ok());
      // Replicated: same storage.
      EXPECT_EQ((*shard)->token_embedding.data, full().token_embedding.data);
      EXPECT_EQ((*shard)->output.data, full().output.data);
      EXPECT_EQ((*shard)->final_norm.data, full().final_norm.data);
      for (int l = 0; l < full().config.num_layers; ++l) {
        const LayerWeights& f = full().layers[l];
        const LayerWeights& s = (*shard)->layers[l];
        const int64_t q_rows = (plan.q_head_end - plan.q_head_begin) * hd;
        const int64_t kv_rows = (plan.kv_head_end - plan.kv_head_begin) * hd;
        const int64_t ffn = plan.ffn_end - plan.ffn_begin;
        EXPECT_EQ(s.attn_norm.data, f.attn_norm.data);
        EXPECT_EQ(s.ffn_norm.data, f.ffn_norm.data);
        // Row splits are views at the right offset.
        EXPECT_EQ(s.wq.shape, (std::vector<int64_t>{q_rows, hidden}));
        EXPECT_EQ(Bytes(s.wq), Bytes(f.wq) + plan.q_head_begin * hd * f.wq.row_bytes());
        EXPECT_EQ(s.wk.shape, (std::vector<int64_t>{kv_rows, hidden}));
        EXPECT_EQ(Bytes(s.wk), Bytes(f.wk) + plan.kv_head_begin * hd * f.wk.row_bytes());
        EXPECT_EQ(Bytes(s.wv), Bytes(f.wv) + plan.kv_head_begin * hd * f.wv.row_bytes());
        EXPECT_EQ(s.w_gate.shape, (std::vector<int64_t>{ffn, hidden}));
        EXPECT_EQ(Bytes(s.w_gate), Bytes(f.w_gate) + plan.ffn_begin * f.w_gate.row_bytes());
        EXPECT_EQ(Bytes(s.w_up), Bytes(f.w_up) + plan.ffn_begin * f.w_up.row_bytes());
        // Column splits are copies of the right columns.
        ASSERT_EQ(s.wo.shape, (std::vector<int64_t>{hidden, q_rows}));
        ASSERT_EQ(s.w_down.shape, (std::vector<int64_t>{hidden, ffn}));
        for (int64_t i = 0; i < hidden; i += 7) {
          for (int64_t j = 0; j < q_rows; ++j) {
            ASSERT_EQ(At(s.wo, i, j), At(f.wo, i, plan.q_head_begin * hd + j));
          }
          for (int64_t j = 0; j < ffn; ++j) {
            ASSERT_EQ(At(s.w_down, i, j), At(f.w_down, i, plan.ffn_begin + j));
          }
        }
      }
    }
  }
}

TEST_F(StoriesShardTest, ReplicatedKvHeadIsTheOneTheQueryHeadsRead) {
  // GQA maps query head h to kv head h / (num_heads / num_kv_heads) = h / 2 here.
  for (int r = 0; r < 8; ++r) {
    const auto shard = *ShardWeights(full(), r, 8);
    const LayerWeights& f = full().layers[2];
    const LayerWeights& s = shard->layers[2];
    const int kv_head = r / 2;
    EXPECT_EQ(Bytes(s.wk), Bytes(f.wk) + kv_head * 8 * f.wk.row_bytes()) << r;
    EXPECT_EQ(Bytes(s.wv), Bytes(f.wv) + kv_head * 8 * f.wv.row_bytes()) << r;
  }
}

TEST_F(StoriesShardTest, TpOneIsTheWholeModel) {
  const auto shard = *ShardWeights(full(), 0, 1);
  EXPECT_EQ(shard->config.num_heads, 8);
  EXPECT_EQ(shard->config.num_kv_heads, 4);
  EXPECT_EQ(shard->config.intermediate_size, 172);
  EXPECT_TRUE(shard->owned_buffers.empty());  // nothing copied
  EXPECT_EQ(shard->layers[0].wo.data, full().layers[0].wo.data);
  EXPECT_EQ(shard->layers[0].w_down.data, full().layers[0].w_down.data);
}

TEST_F(StoriesShardTest, Errors) {
  auto expect_error = [&](int rank, int tp, const std::string& needle) {
    absl::StatusOr<std::unique_ptr<ModelWeights>> s = ShardWeights(full(), rank, tp);
    ASSERT_FALSE(s.ok()) << "tp " << tp;
    EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << s.status();
    EXPECT_NE(s.status().message().find(needle), std::string::npos) << s.status();
  };
  expect_error(0, 3, "does not divide num_heads 8");
  expect_error(0, 16, "does not divide num_heads 8");
  expect_error(0, 0, "tensor parallel size 0");
  expect_error(2, 2, "rank 2 outside [0, 2)");
  expect_error(-1, 2, "rank -1");

  ModelWeights bad;
  bad.config = full().config;
  bad.layers = full().layers;
  bad.token_embedding = full().token_embedding;
  bad.output = full().output;
  bad.final_norm = full().final_norm;
  bad.layers[3].wk.shape = {16, 64};
  absl::StatusOr<ShardPlan> p = PlanShard(bad, 0, 2);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("has shape [16, 64], expected [32, 64]"), std::string::npos)
      << p.status();
  bad.layers.pop_back();
  EXPECT_NE(PlanShard(bad, 0, 2).status().message().find("4 layers loaded"), std::string::npos);
}

TEST(SyntheticShardTest, KvHeadsThatCannotBeDistributed) {
  SyntheticModelOptions o;
  o.num_layers = 1;
  o.hidden_size = 192;
  o.num_heads = 12;
  o.num_kv_heads = 4;
  o.intermediate_size = 64;
  o.vocab_size = 32;
  auto w = *MakeSyntheticModel(o);
  // 6 divides 12 heads, but neither 6 | 4 nor 4 | 6.
  absl::StatusOr<ShardPlan> p = PlanShard(*w, 0, 6);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("num_kv_heads 4"), std::string::npos) << p.status();
  EXPECT_TRUE(PlanShard(*w, 0, 2).ok());
  EXPECT_TRUE(PlanShard(*w, 0, 4).ok());
  ShardPlan p12 = *PlanShard(*w, 11, 12);  // 3 query heads per kv head: rank 11 reads kv head 3
  EXPECT_EQ(p12.kv_head_begin, 3);
  EXPECT_TRUE(p12.kv_replicated);
}

TEST(SyntheticShardTest, QuantizedWeightsSplitOnBlockBoundaries) {
  SyntheticModelOptions o;
  o.num_layers = 2;
  o.hidden_size = 128;
  o.num_heads = 8;  // head_dim 16: two heads per 32-element q8_0 block
  o.num_kv_heads = 8;
  o.intermediate_size = 96;  // three q8_0 blocks
  o.vocab_size = 64;
  o.dtype = DType::kQ8_0;
  auto w = *MakeSyntheticModel(o);

  // tp 2: wo cut at column 64, MLP blocks split 1 + 2.
  ShardPlan p0 = *PlanShard(*w, 0, 2);
  ShardPlan p1 = *PlanShard(*w, 1, 2);
  EXPECT_EQ(p0.ffn_end, 32);
  EXPECT_EQ(p1.ffn_begin, 32);
  EXPECT_EQ(p1.ffn_end, 96);
  auto s1 = *ShardWeights(*w, 1, 2);
  const LayerWeights& f = w->layers[1];
  const LayerWeights& s = s1->layers[1];
  ASSERT_EQ(s.w_down.shape, (std::vector<int64_t>{128, 64}));
  ASSERT_EQ(s.w_down.row_bytes(), 2 * 34);
  for (int64_t row = 0; row < 128; ++row) {
    // Row `row` of the shard = blocks 1 and 2 of the full row, bytes unchanged.
    ASSERT_EQ(0, std::memcmp(Bytes(s.w_down) + row * 68, Bytes(f.w_down) + row * 102 + 34, 68));
  }
  ASSERT_EQ(s.wo.shape, (std::vector<int64_t>{128, 64}));
  for (int64_t row = 0; row < 128; ++row) {
    ASSERT_EQ(0, std::memcmp(Bytes(s.wo) + row * 68, Bytes(f.wo) + row * 136 + 68, 68));
  }

  o.intermediate_size = 256;  // 8 blocks: enough for tp 8
  auto w8 = *MakeSyntheticModel(o);
  EXPECT_TRUE(ShardWeights(*w8, 3, 4).ok());  // 2 heads = 32 columns per rank
  // tp 8: one 16-column head per rank would cut wo inside a block.
  absl::StatusOr<ShardPlan> p8 = PlanShard(*w8, 0, 8);
  ASSERT_FALSE(p8.ok());
  EXPECT_NE(p8.status().message().find("inside a 32-element quantization block"), std::string::npos)
      << p8.status();
  // tp 4 on a 96-row MLP: 3 blocks for 4 ranks.
  o.num_heads = 4;
  o.num_kv_heads = 4;
  o.intermediate_size = 96;
  auto w4 = *MakeSyntheticModel(o);
  absl::StatusOr<ShardPlan> p4 = PlanShard(*w4, 0, 4);
  ASSERT_FALSE(p4.ok());
  EXPECT_NE(p4.status().message().find("exceeds the 3 splittable MLP blocks"), std::string::npos)
      << p4.status();
}

// K-quant super-blocks are 256 elements: a shard keeps whole ones, and a cut inside one (wo
// columns or MLP rows) is refused naming the tensor and the block size.
TEST(SyntheticShardTest, KQuantWeightsSplitOnSuperBlockBoundaries) {
  SyntheticModelOptions o;
  o.num_layers = 2;
  o.hidden_size = 512;
  o.num_heads = 4;  // head_dim 128: two heads per 256-element super-block of wo's rows
  o.num_kv_heads = 4;
  o.intermediate_size = 768;  // three super-blocks of w_down's rows
  o.vocab_size = 64;
  o.dtype = DType::kQ4_K;
  o.mix = WeightMix::kKQuantMedium;  // layer 1's w_down (and output) in q6_k
  auto w = *MakeSyntheticModel(o);
  ASSERT_EQ(w->layers[0].w_down.dtype, DType::kQ4_K);
  ASSERT_EQ(w->layers[1].w_down.dtype, DType::kQ6_K);

  // tp 2: wo cut at column 256, MLP super-blocks split 1 + 2.
  ShardPlan p1 = *PlanShard(*w, 1, 2);
  EXPECT_EQ(p1.ffn_begin, 256);
  EXPECT_EQ(p1.ffn_end, 768);
  auto s1 = *ShardWeights(*w, 1, 2);
  for (int l = 0; l < 2; ++l) {
    const TensorView& full = w->layers[l].w_down;
    const TensorView& part = s1->layers[l].w_down;
    const int64_t block = DTypeBlockBytes(full.dtype);
    ASSERT_EQ(part.shape, (std::vector<int64_t>{512, 512}));
    ASSERT_EQ(part.row_bytes(), 2 * block);
    for (int64_t row = 0; row < 512; ++row) {
      ASSERT_EQ(0, std::memcmp(Bytes(part) + row * 2 * block, Bytes(full) + row * 3 * block + block,
                               2 * block));
    }
  }

  // tp 4: three MLP super-blocks for four ranks.
  absl::StatusOr<ShardPlan> p3 = PlanShard(*w, 0, 4);
  ASSERT_FALSE(p3.ok());
  EXPECT_NE(p3.status().message().find("exceeds the 3 splittable MLP blocks of 256 rows"),
            std::string::npos)
      << p3.status();
  // With four MLP super-blocks, one 128-column head per rank still cuts wo inside one.
  o.intermediate_size = 1024;
  o.num_layers = 1;
  auto w4 = *MakeSyntheticModel(o);
  absl::StatusOr<ShardPlan> p4 = PlanShard(*w4, 0, 4);
  ASSERT_FALSE(p4.ok());
  EXPECT_NE(p4.status().message().find("blk.0.attn_output (q4_k) would be split at column 128, "
                                       "inside a 256-element quantization block"),
            std::string::npos)
      << p4.status();
}

}  // namespace
}  // namespace kvserve
