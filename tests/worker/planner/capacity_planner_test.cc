#include "worker/planner/capacity_planner.h"

#include <string>

#include "gtest/gtest.h"
#include "tests/worker/planner/model_configs.h"
#include "tests/worker/planner/planner_test_util.h"
#include "worker/planner/model_spec_loader.h"

namespace kvserve {
namespace {

namespace cfg = testing_configs;

ModelSpec Spec(const char* json) {
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfigJson(json, "config.json");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : ModelSpec();
}

int64_t KvBytes(const char* json, KvCacheDType dtype, int tp) {
  absl::StatusOr<int64_t> bytes = KvBytesPerToken(Spec(json), dtype, tp);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.value_or(-1);
}

constexpr KvCacheDType kBF16 = KvCacheDType::kBF16;

// Reference figures: layers × 2 (K, V) × KV heads × head_dim × 2 bytes (bf16), as published in
// many KV-cache sizing guides for these models.
TEST(KvBytesPerTokenTest, PublishedBf16Figures) {
  EXPECT_EQ(KvBytes(cfg::kLlama3_8B, kBF16, 1), 131072);
  EXPECT_EQ(KvBytes(cfg::kLlama2_7B, kBF16, 1), 524288);
  EXPECT_EQ(KvBytes(cfg::kLlama3_70B, kBF16, 1), 327680);
  EXPECT_EQ(KvBytes(cfg::kLlama3_70B, kBF16, 8), 40960);
  EXPECT_EQ(KvBytes(cfg::kMistral7B, kBF16, 1), 131072);
  EXPECT_EQ(KvBytes(cfg::kMixtral8x7B, kBF16, 1), 131072);
  // Qwen2-7B: 28 layers × 2 × 4 heads × 128 × 2.
  EXPECT_EQ(KvBytes(cfg::kQwen2_7B, kBF16, 1), 57344);
  EXPECT_EQ(KvBytes(cfg::kQwen2_7B, kBF16, 4), 14336);
  // tp 8 > 4 KV heads: each head is cached on two GPUs, one head per GPU.
  EXPECT_EQ(*KvHeadsPerGpu(Spec(cfg::kQwen2_7B), 8), 1);
  EXPECT_EQ(KvBytes(cfg::kQwen2_7B, kBF16, 8), 14336);
}

TEST(KvBytesPerTokenTest, MlaCachesOneLatentOnEveryRank) {
  // (kv_lora_rank 512 + rope 64) × 60 layers × 2 bytes.
  for (int tp : {1, 2, 8, 16}) {
    EXPECT_EQ(KvBytes(cfg::kDeepSeekV2, kBF16, tp), (512 + 64) * 60 * 2) << tp;
  }
  EXPECT_EQ(KvBytes(cfg::kDeepSeekV3, kBF16, 8), (512 + 64) * 61 * 2);
  EXPECT_EQ(KvBytes(cfg::kDeepSeekV2, KvCacheDType::kInt8, 1), (576 + 4) * 60);
  EXPECT_EQ(KvBytes(cfg::kDeepSeekV2, KvCacheDType::kF32, 1), 576 * 4 * 60);
}

TEST(KvBytesPerTokenTest, OtherDTypes) {
  EXPECT_EQ(KvBytes(cfg::kLlama3_8B, KvCacheDType::kF32, 1), 262144);
  EXPECT_EQ(KvBytes(cfg::kLlama3_8B, KvCacheDType::kF16, 1), 131072);
  // 32 layers × 2 × 8 heads × (128 bytes + a 4-byte scale).
  EXPECT_EQ(KvBytes(cfg::kLlama3_8B, KvCacheDType::kInt8, 1), 67584);
  EXPECT_EQ(KvBytes(cfg::kLlama3_8B, KvCacheDType::kFp8E4M3, 1), 67584);
  EXPECT_EQ(KvBytes(cfg::kLlama3_70B, KvCacheDType::kFp8E4M3, 8), 80 * 2 * 132);
}

TEST(KvBytesPerTokenTest, TpMustDivideOrBeAMultipleOfKvHeads) {
  const ModelSpec spec = Spec(cfg::kLlama3_8B);
  EXPECT_EQ(KvHeadsPerGpu(spec, 3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvHeadsPerGpu(spec, 12).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*KvHeadsPerGpu(spec, 16), 1);
  EXPECT_EQ(KvHeadsPerGpu(spec, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvBlocksForBudgetTest, Floors) {
  const ModelSpec spec = Spec(cfg::kLlama3_8B);
  // 131072 bytes/token × 16 = 2 MiB per block.
  EXPECT_EQ(*KvBytesPerBlock(spec, kBF16, 1, 16), int64_t{2} << 20);
  EXPECT_EQ(*KvBlocksForBudget(spec, kBF16, 1, 16, int64_t{10} << 30), 5120);
  EXPECT_EQ(*KvBlocksForBudget(spec, kBF16, 1, 16, (int64_t{10} << 30) - 1), 5119);
  EXPECT_EQ(*KvBlocksForBudget(spec, kBF16, 1, 16, 0), 0);
  EXPECT_FALSE(KvBlocksForBudget(spec, kBF16, 1, 16, -1).ok());
  EXPECT_FALSE(KvBlocksForBudget(spec, kBF16, 1, 0, 1 << 30).ok());
  EXPECT_FALSE(KvBlocksForBudget(spec, kBF16, 3, 16, 1 << 30).ok());
}

TEST(ConcurrencyTest, SharedPrefixArithmetic) {
  // 100 blocks of 16 tokens; sequences of 200 tokens need ceil(200/16) = 13 blocks.
  EXPECT_EQ(MaxConcurrentSeqs(100, 200, 16), 7);
  // A 150-token shared prefix has floor(150/16) = 9 full blocks held once: each sequence needs
  // 13 − 9 = 4 blocks of its own, out of 100 − 9 = 91 → 22 sequences.
  EXPECT_EQ(MaxConcurrentSeqsSharedPrefix(100, 200, 150, 16), 22);
  // A prefix shorter than a block shares nothing.
  EXPECT_EQ(MaxConcurrentSeqsSharedPrefix(100, 200, 15, 16), 7);
  EXPECT_EQ(MaxConcurrentSeqsSharedPrefix(100, 200, 0, 16), 7);
  // Exactly 32 tokens: 2 shared blocks → (10 − 2) / (4 − 2) = 4 (vs 10 / 4 = 2).
  EXPECT_EQ(MaxConcurrentSeqs(10, 64, 16), 2);
  EXPECT_EQ(MaxConcurrentSeqsSharedPrefix(10, 64, 32, 16), 4);
  // Not even the shared blocks fit.
  EXPECT_EQ(MaxConcurrentSeqsSharedPrefix(5, 200, 150, 16), 0);
  EXPECT_EQ(MaxConcurrentSeqs(0, 200, 16), 0);
}

// stories260K f32 (weights 1040128 bytes) with every figure worked out by hand:
//   KV bf16: 5 layers × 2 × 4 heads × 8 × 2 = 640 bytes/token, 10240 per 16-token block.
//   activations, elements per token: residual 64 + normed 64 + q 64 + k 32 + v 32 + attn_out 64
//     + gate 172 + up 172 = 664; the residual in f32, the other 600 in bf16: (64 × 4 + 600 × 2)
//     × 64 tokens = 93184 bytes; logits 4 seqs × 512 × 4 = 8192.
//   GPU memory = weights + activations + 1029000 → KV budget 1029000.
TEST(PlanCapacityTest, HandWorkedStories260K) {
  absl::StatusOr<ModelSpec> spec = LoadModelSpec(planner_testing::Stories260KDir());
  ASSERT_TRUE(spec.ok()) << spec.status();
  PlanOptions options;
  options.gpu_memory_bytes = 1040128 + 93184 + 8192 + 1029000;
  options.gpu_memory_utilization = 1.0;
  options.max_num_batched_tokens = 64;
  options.max_num_seqs = 4;
  options.workspace_bytes = 0;
  options.max_model_len = 200;
  options.shared_prefix_len = 150;
  options.kv_dtype = KvCacheDType::kInt8;
  absl::StatusOr<Plan> plan = PlanCapacity(*spec, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->num_params, 260032);
  EXPECT_TRUE(plan->weight_bytes_exact);
  EXPECT_EQ(plan->weight_bytes, 1040128);
  EXPECT_EQ(plan->activations.elements_per_token, 664);
  EXPECT_EQ(plan->activations.f32_elements_per_token, 64);
  EXPECT_EQ(plan->activations.buffer_bytes, 93184);
  EXPECT_EQ(plan->activations.logits_bytes, 8192);
  EXPECT_EQ(plan->kv_budget_bytes, 1029000);
  EXPECT_EQ(plan->kv_heads_per_gpu, 4);
  ASSERT_EQ(plan->by_kv_dtype.size(), 5u);

  const KvDTypePlan& bf16 = plan->by_kv_dtype[2];
  EXPECT_EQ(bf16.dtype, kBF16);
  EXPECT_EQ(bf16.kv_bytes_per_token, 640);
  EXPECT_EQ(bf16.bytes_per_block, 10240);
  EXPECT_EQ(bf16.num_kv_blocks, 100);  // 1029000 / 10240 = 100.5
  EXPECT_EQ(bf16.kv_tokens, 1600);
  EXPECT_EQ(bf16.max_concurrent_seqs, 7);                 // 100 / 13
  EXPECT_EQ(bf16.max_concurrent_seqs_shared_prefix, 22);  // 91 / 4

  const KvDTypePlan& f32 = plan->by_kv_dtype[0];
  EXPECT_EQ(f32.kv_bytes_per_token, 1280);
  EXPECT_EQ(f32.num_kv_blocks, 50);  // 1029000 / 20480
  EXPECT_EQ(f32.max_concurrent_seqs, 3);
  EXPECT_EQ(f32.max_concurrent_seqs_shared_prefix, 10);  // 41 / 4

  // int8: 8 bytes + a 4-byte scale per head → 5 × 2 × 4 × 12 = 480 bytes/token.
  const KvDTypePlan& chosen = plan->chosen();
  EXPECT_EQ(chosen.dtype, KvCacheDType::kInt8);
  EXPECT_EQ(chosen.kv_bytes_per_token, 480);
  EXPECT_EQ(chosen.num_kv_blocks, 133);  // 1029000 / 7680
  EXPECT_EQ(chosen.max_concurrent_seqs, 10);
  EXPECT_EQ(chosen.max_concurrent_seqs_shared_prefix, 31);  // 124 / 4
  EXPECT_EQ(plan->by_kv_dtype[4].num_kv_blocks, 133);
}

TEST(PlanCapacityTest, WeightsPerGpuUnderTp) {
  const ModelSpec spec = Spec(cfg::kLlama3_8B);
  // Config only: parameters × bf16. tp 1 is the whole model.
  EXPECT_EQ(*WeightBytesPerGpu(spec, std::nullopt, 1), 2 * 8'030'261'248);
  // tp 2: everything halves but the 266240 replicated norm weights.
  const int64_t replicated = 32 * 2 * 4096 + 4096;
  EXPECT_EQ(*WeightBytesPerGpu(spec, std::nullopt, 2), 8'030'261'248 - replicated + 2 * replicated);
  // tp 16: split and vocab / 16, one of 8 KV heads' k/v rows, norms whole.
  const int64_t split = int64_t{32} * (2 * 4096 * 4096 + 3 * 4096 * 14336);
  const int64_t kv = int64_t{32} * 2 * 4096 * 1024;
  const int64_t vocab = 2 * 128256 * 4096;
  EXPECT_EQ(*WeightBytesPerGpu(spec, std::nullopt, 16),
            2 * (split / 16 + kv / 8 + vocab / 16 + replicated));
  EXPECT_EQ(*WeightBytesPerGpu(spec, WeightDType::kF32, 1), 4 * 8'030'261'248);
}

// Llama-3-8B on one 80 GiB GPU with the default options, every figure worked out by hand:
//   usable: floor(80 GiB × 0.9) = floor(85899345920 × 0.9) = 77309411328.
//   weights: 8030261248 parameters × 2 (bf16) = 16060522496.
//   activations, elements per token: residual 4096 + normed 4096 + q 32 × 128 + k 8 × 128
//     + v 8 × 128 + attn_out 32 × 128 + gate 14336 + up 14336 = 47104; the residual in f32,
//     the other 43008 in bf16: (4096 × 4 + 43008 × 2) × 8192 tokens = 838860800; logits 256
//     seqs × 128256 × 4 = 131334144; workspace 256 MiB = 268435456; total 1238630400.
//   KV budget: 77309411328 − 16060522496 − 1238630400 = 60010258432.
//   bf16: 32 layers × 2 × 8 heads × 128 × 2 = 131072 bytes/token, × 16 = 2097152 per block;
//     60010258432 / 2097152 = 28615.1 → 28615 blocks; 8192-token sequences need 512 blocks each:
//     28615 / 512 = 55.9 → 55.
//   fp8: 32 × 2 × 8 × (128 + 4) = 67584 bytes/token, 1081344 per block;
//     60010258432 / 1081344 = 55495.9 → 55495 blocks, 55495 / 512 = 108.4 → 108.
TEST(PlanCapacityTest, Llama3_8BOnOneH100) {
  PlanOptions options;  // 80 GiB × 0.9, bf16 KV, 8192 batched tokens, 256 seqs.
  absl::StatusOr<Plan> plan = PlanCapacity(Spec(cfg::kLlama3_8B), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->usable_bytes, 77309411328);
  EXPECT_EQ(plan->weight_bytes, 16'060'522'496);
  EXPECT_FALSE(plan->weight_bytes_exact);
  EXPECT_EQ(plan->max_model_len, 8192);
  EXPECT_EQ(plan->activations.elements_per_token, 47104);
  EXPECT_EQ(plan->activations.f32_elements_per_token, 4096);
  EXPECT_EQ(plan->activations.buffer_bytes, 838'860'800);
  EXPECT_EQ(plan->activations.logits_bytes, 131'334'144);
  EXPECT_EQ(plan->activations.workspace_bytes, 268'435'456);
  EXPECT_EQ(plan->activations.total(), 1'238'630'400);
  EXPECT_EQ(plan->kv_budget_bytes, 60'010'258'432);
  const KvDTypePlan& bf16 = plan->chosen();
  EXPECT_EQ(bf16.dtype, kBF16);
  EXPECT_EQ(bf16.kv_bytes_per_token, 131072);
  EXPECT_EQ(bf16.bytes_per_block, 2'097'152);
  EXPECT_EQ(bf16.num_kv_blocks, 28615);
  EXPECT_EQ(bf16.kv_tokens, 28615 * 16);
  EXPECT_EQ(bf16.max_concurrent_seqs, 55);
  const KvDTypePlan& fp8 = plan->by_kv_dtype[4];
  EXPECT_EQ(fp8.dtype, KvCacheDType::kFp8E4M3);
  EXPECT_EQ(fp8.kv_bytes_per_token, 67584);
  EXPECT_EQ(fp8.num_kv_blocks, 55495);
  EXPECT_EQ(fp8.max_concurrent_seqs, 108);

  // f32 activations (KVSERVE_CUDA_F32_ACTIVATIONS=1): every buffer element 4 bytes, 47104 × 4 ×
  // 8192 = 1543503872, so 704643072 more than with bf16 ones and that much less for the KV cache.
  options.activation_bytes = 4;
  absl::StatusOr<Plan> f32 = PlanCapacity(Spec(cfg::kLlama3_8B), options);
  ASSERT_TRUE(f32.ok()) << f32.status();
  EXPECT_EQ(f32->activations.buffer_bytes, 1'543'503'872);
  EXPECT_EQ(f32->kv_budget_bytes, 60'010'258'432 - 704'643'072);
  options.activation_bytes = 3;
  EXPECT_FALSE(PlanCapacity(Spec(cfg::kLlama3_8B), options).ok());
}

TEST(PlanCapacityTest, ReplicatedKvHeadsAtTp16) {
  PlanOptions options;
  options.tp = 16;
  absl::StatusOr<Plan> plan = PlanCapacity(Spec(cfg::kLlama3_8B), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->kv_heads_replicated);
  EXPECT_EQ(plan->kv_heads_per_gpu, 1);
  EXPECT_EQ(plan->chosen().kv_bytes_per_token, 32 * 2 * 256);
}

TEST(PlanCapacityTest, TpMustDivideAttentionHeads) {
  PlanOptions options;
  options.tp = 8;  // Qwen2-7B has 28 query heads: 8 does not divide them.
  absl::StatusOr<Plan> plan = PlanCapacity(Spec(cfg::kQwen2_7B), options);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("num_attention_heads (28)"), std::string::npos)
      << plan.status();
  options.tp = 3;
  EXPECT_EQ(PlanCapacity(Spec(cfg::kLlama3_8B), options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.tp = 4;
  EXPECT_TRUE(PlanCapacity(Spec(cfg::kQwen2_7B), options).ok());
}

TEST(PlanCapacityTest, BudgetSmallerThanWeightsIsAnError) {
  PlanOptions options;  // Llama-3-70B in bf16 is 141 GB: it does not fit one 80 GiB GPU.
  absl::StatusOr<Plan> plan = PlanCapacity(Spec(cfg::kLlama3_70B), options);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(plan.status().message().find("weights need"), std::string::npos) << plan.status();
  options.tp = 4;
  EXPECT_TRUE(PlanCapacity(Spec(cfg::kLlama3_70B), options).ok());
  // Weights fit, but activations leave nothing for the cache.
  options.tp = 2;
  options.workspace_bytes = int64_t{10} << 30;
  plan = PlanCapacity(Spec(cfg::kLlama3_70B), options);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(plan.status().message().find("no memory left"), std::string::npos) << plan.status();
}

TEST(PlanCapacityTest, MlaPlan) {
  PlanOptions options;
  options.gpu_memory_bytes = int64_t{141} << 30;
  options.tp = 8;
  options.weight_dtype = WeightDType::kFp8;
  absl::StatusOr<Plan> plan = PlanCapacity(Spec(cfg::kDeepSeekV3), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->kv_heads_per_gpu, 1);
  EXPECT_FALSE(plan->kv_heads_replicated);
  EXPECT_EQ(plan->chosen().kv_bytes_per_token, 576 * 61 * 2);
  EXPECT_GT(plan->chosen().max_concurrent_seqs, 0);
}

TEST(PlanCapacityTest, RejectsBadOptions) {
  const ModelSpec spec = Spec(cfg::kLlama3_8B);
  PlanOptions options;
  options.gpu_memory_utilization = 0;
  EXPECT_EQ(PlanCapacity(spec, options).status().code(), absl::StatusCode::kInvalidArgument);
  options.gpu_memory_utilization = 1.5;
  EXPECT_EQ(PlanCapacity(spec, options).status().code(), absl::StatusCode::kInvalidArgument);
  options = PlanOptions();
  options.block_size = 0;
  EXPECT_EQ(PlanCapacity(spec, options).status().code(), absl::StatusCode::kInvalidArgument);
  options = PlanOptions();
  options.shared_prefix_len = 8192;  // not below max_model_len
  absl::StatusOr<Plan> plan = PlanCapacity(spec, options);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("shared_prefix_len"), std::string::npos);
  // A model that does not state its length needs max_model_len.
  ModelSpec no_len = spec;
  no_len.max_position_embeddings = 0;
  EXPECT_EQ(PlanCapacity(no_len, PlanOptions()).status().code(),
            absl::StatusCode::kInvalidArgument);
  PlanOptions with_len;
  with_len.max_model_len = 4096;
  EXPECT_TRUE(PlanCapacity(no_len, with_len).ok());
}

// Llama-3-8B over pp 2 × tp 1 on 80 GiB GPUs, with the default options but f32 activations (so
// every buffer element is 4 bytes; the pipeline tests below keep them too), by hand:
//   weights: one layer 2H + 2·H·32·128 + 2·H·8·128 + 3·H·I = 218112000 parameters; stage 0 holds
//     16 layers and the embedding V·H, stage 1 16 layers, the final norm H and the head V·H; × 2.
//   activations: 47104 elements per token × 8192 × 4 as with pp 1 (both stages are dense);
//     stage 0 adds the hidden-state buffers 2 × 8192 × H × 4, stage 1 the logits 256 × V × 4.
//   KV: 16 layers × 2 × 8 heads × 128 × 2 = 65536 bytes per token, 1048576 per 16-token block.
TEST(PipelinePlanTest, DenseTwoStages) {
  const int64_t h = 4096, v = 128256;
  const int64_t layer = 2 * h + 2 * h * 32 * 128 + 2 * h * 8 * 128 + 3 * h * 14336;
  const int64_t usable = 77309411328;  // floor(80 GiB × 0.9), see Llama3_8BOnOneH100
  const int64_t buffers = int64_t{47104} * 8192 * 4;
  const int64_t workspace = int64_t{256} << 20;
  const int64_t weights[2] = {2 * (16 * layer + v * h), 2 * (16 * layer + v * h + h)};
  const int64_t activations[2] = {buffers + 2 * 8192 * h * 4 + workspace,
                                  buffers + 256 * v * 4 + workspace};
  const int64_t block = 16 * 2 * 8 * 128 * 2 * 16;

  PlanOptions options;
  options.pp = 2;
  options.activation_bytes = 4;
  absl::StatusOr<Plan> plan = PlanCapacity(Spec(cfg::kLlama3_8B), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->pp, 2);
  ASSERT_EQ(plan->stages.size(), 2u);
  int64_t blocks[2];
  for (int s = 0; s < 2; ++s) {
    const StagePlan& stage = plan->stages[s];
    EXPECT_EQ(stage.layers.first, 16 * s);
    EXPECT_EQ(stage.layers.count, 16);
    EXPECT_EQ(stage.weight_bytes, weights[s]) << s;
    EXPECT_EQ(stage.activations.total(), activations[s]) << s;
    EXPECT_EQ(stage.kv_budget_bytes, usable - weights[s] - activations[s]) << s;
    const KvDTypePlan& kv = plan->chosen(stage);
    EXPECT_EQ(kv.kv_bytes_per_token, 65536);
    EXPECT_EQ(kv.bytes_per_block, block);
    blocks[s] = (usable - weights[s] - activations[s]) / block;
    EXPECT_EQ(kv.num_kv_blocks, blocks[s]) << s;
  }
  EXPECT_EQ(plan->stages[0].activations.pipeline_bytes, 268435456);
  EXPECT_EQ(plan->stages[0].activations.logits_bytes, 0);
  EXPECT_EQ(plan->stages[1].activations.pipeline_bytes, 0);
  EXPECT_EQ(plan->stages[1].activations.logits_bytes, 131334144);
  // 67198779392 / 1048576 = 64085.9 and 67335872512 / 1048576 = 64216.4: the first stage, with the
  // larger send/receive buffers, limits the group.
  EXPECT_EQ(blocks[0], 64085);
  EXPECT_EQ(blocks[1], 64216);
  const KvDTypePlan& group = plan->chosen();
  EXPECT_EQ(group.num_kv_blocks, 64085);
  EXPECT_EQ(group.limiting_stage, 0);
  EXPECT_EQ(group.kv_tokens, 64085 * 16);
  EXPECT_EQ(group.kv_bytes_per_token, 65536);
  EXPECT_EQ(group.max_concurrent_seqs, 64085 / 512);
  // The per-GPU figures outside the stages are the worst of them.
  EXPECT_EQ(plan->weight_bytes, weights[1]);
  EXPECT_EQ(plan->activations.total(), activations[0]);
  EXPECT_EQ(plan->kv_budget_bytes, usable - weights[0] - activations[0]);
}

TEST(PipelinePlanTest, ExplicitPartitionMovesTheLimit) {
  PlanOptions options;
  options.pp = 2;
  options.activation_bytes = 4;
  options.pp_layers = {15, 17};
  absl::StatusOr<Plan> plan = PlanCapacity(Spec(cfg::kLlama3_8B), options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->stages.size(), 2u);
  EXPECT_EQ(plan->stages[1].layers.first, 15);
  EXPECT_EQ(plan->stages[1].layers.count, 17);
  // Stage 1's 17 layers make its blocks the largest and its budget the smallest (same formulas as
  // DenseTwoStages): 66899648512 / (17 × 4096 × 16) = 60047.
  EXPECT_EQ(plan->chosen(plan->stages[1]).kv_bytes_per_token, 17 * 4096);
  EXPECT_EQ(plan->chosen(plan->stages[1]).num_kv_blocks, 60047);
  EXPECT_EQ(plan->chosen(plan->stages[0]).num_kv_blocks, 68801);
  EXPECT_EQ(plan->chosen().num_kv_blocks, 60047);
  EXPECT_EQ(plan->chosen().limiting_stage, 1);
  // The stage with the most layers sets the group's KV bytes per token.
  EXPECT_EQ(plan->chosen().kv_bytes_per_token, 17 * 4096);
  for (const KvDTypePlan& entry : plan->by_kv_dtype) EXPECT_EQ(entry.limiting_stage, 1);
}

// DeepSeek-V3 at fp8 over pp 2 × tp 8 on 141 GB GPUs (see StageWeightBytesTest for the weights):
//   per GPU, stage 0: 323433267200 / 8 split + 521198592 replicated + 926679040 / 8 vocab
//     = 41066191872; stage 1: 344708874240 / 8 + 509721088 + 926679040 / 8 = 43714165248.
//   activations: 2H + MLA 2·16·192 + 2·16·128 + 512 + 64 + 1536 + MoE 256 + 2·9·256 = 31552
//     elements per token (the dense MLP's 2·18432/8 = 4608 is smaller) × 8192 × 4; stage 0 adds
//     2 × 8192 × H × 4, stage 1 the logits 256 × 129280 × 4; both the 256 MiB workspace.
//   KV: 576 × 2 bytes per layer and token (the MLA latent, on every rank).
TEST(PipelinePlanTest, DeepSeekV3TwoStages) {
  const int64_t h = 7168, v = 129280;
  const int64_t usable = 126'900'000'000;  // 141e9 × 0.9
  const int64_t weights[2] = {323433267200 / 8 + 521198592 + v * h / 8,
                              344708874240 / 8 + 509721088 + v * h / 8};
  const int64_t buffers = int64_t{31552} * 8192 * 4;
  const int64_t workspace = int64_t{256} << 20;
  const int64_t activations[2] = {buffers + 2 * 8192 * h * 4 + workspace,
                                  buffers + 256 * v * 4 + workspace};
  PlanOptions options;
  options.gpu_memory_bytes = 141'000'000'000;
  options.tp = 8;
  options.pp = 2;
  options.activation_bytes = 4;
  options.weight_dtype = WeightDType::kFp8;
  const ModelSpec spec = Spec(cfg::kDeepSeekV3);
  absl::StatusOr<Plan> plan = PlanCapacity(spec, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->stages.size(), 2u);
  EXPECT_EQ(plan->usable_bytes, usable);
  EXPECT_FALSE(plan->weight_bytes_exact);
  const int counts[2] = {31, 30};
  for (int s = 0; s < 2; ++s) {
    const StagePlan& stage = plan->stages[s];
    EXPECT_EQ(stage.layers.count, counts[s]);
    EXPECT_EQ(stage.weight_bytes, weights[s]) << s;
    EXPECT_EQ(stage.activations.elements_per_token, 31552) << s;
    EXPECT_EQ(stage.activations.f32_elements_per_token, h + 256) << s;  // residual, router
    EXPECT_EQ(stage.activations.total(), activations[s]) << s;
    EXPECT_EQ(plan->chosen(stage).kv_bytes_per_token, counts[s] * 576 * 2);
  }
  EXPECT_EQ(weights[0], 41'066'191'872);
  EXPECT_EQ(weights[1], 43'714'165'248);
  // Budgets 84061714688 and 81751120640; bf16 blocks of 31 × 1152 × 16 = 571392 and
  // 30 × 1152 × 16 = 552960 bytes: 147117.4 and 147842.7.
  EXPECT_EQ(plan->stages[0].kv_budget_bytes, 84'061'714'688);
  EXPECT_EQ(plan->stages[1].kv_budget_bytes, 81'751'120'640);
  EXPECT_EQ(plan->chosen(plan->stages[0]).num_kv_blocks, 147117);
  EXPECT_EQ(plan->chosen(plan->stages[1]).num_kv_blocks, 147842);
  EXPECT_EQ(plan->chosen().num_kv_blocks, 147117);
  EXPECT_EQ(plan->chosen().limiting_stage, 0);
  EXPECT_EQ(plan->chosen().kv_bytes_per_token, 31 * 576 * 2);
  // 163840-token sequences need 10240 blocks each.
  EXPECT_EQ(plan->chosen().max_concurrent_seqs, 14);
  // fp8 KV: 576 bytes + a 4-byte scale per layer: 84061714688 / (31 × 580 × 16) = 292205.
  EXPECT_EQ(plan->by_kv_dtype[4].num_kv_blocks, 292205);
  EXPECT_EQ(plan->by_kv_dtype[4].max_concurrent_seqs, 28);

  // With only the three dense layers in stage 0, its MLP buffers are the dense ones.
  options.pp_layers = {3, 58};
  plan = PlanCapacity(spec, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->stages[0].activations.elements_per_token, 31552 - 4864 + 4608);
  EXPECT_EQ(plan->stages[1].activations.elements_per_token, 31552);
}

TEST(PipelinePlanTest, OneStageIsTheWholePlan) {
  absl::StatusOr<Plan> plan = PlanCapacity(Spec(cfg::kLlama3_8B), PlanOptions());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->pp, 1);
  ASSERT_EQ(plan->stages.size(), 1u);
  EXPECT_EQ(plan->stages[0].layers.count, 32);
  EXPECT_EQ(plan->stages[0].weight_bytes, plan->weight_bytes);
  EXPECT_EQ(plan->stages[0].kv_budget_bytes, plan->kv_budget_bytes);
  EXPECT_EQ(plan->stages[0].activations.pipeline_bytes, 0);
  EXPECT_EQ(plan->chosen(plan->stages[0]).num_kv_blocks, plan->chosen().num_kv_blocks);
  EXPECT_EQ(plan->chosen().limiting_stage, 0);
}

TEST(PipelinePlanTest, Refusals) {
  const ModelSpec spec = Spec(cfg::kLlama3_8B);
  PlanOptions options;
  options.pp = 33;
  absl::StatusOr<Plan> plan = PlanCapacity(spec, options);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.status().message(),
            "--pp 33 needs at least one layer per stage; the model has 32 layers");
  options.pp = 0;
  EXPECT_EQ(PlanCapacity(spec, options).status().message(), "pp must be >= 1 (got 0)");
  options.pp = 2;
  options.pp_layers = {16, 15};
  EXPECT_EQ(PlanCapacity(spec, options).status().message(),
            "--pp-layers 16,15 adds up to 31 layers; the model has 32");
  options.pp_layers = {32};
  EXPECT_EQ(PlanCapacity(spec, options).status().message(),
            "--pp-layers lists 1 stages; --pp is 2");

  // tp must still divide the attention heads, whatever pp.
  options = PlanOptions();
  options.pp = 2;
  options.tp = 8;
  plan = PlanCapacity(Spec(cfg::kQwen2_7B), options);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.status().message(),
            "config.json: tp 8 does not divide num_attention_heads (28): attention heads cannot be "
            "split evenly");

  // Llama-3-70B in bf16 over 2 stages of one 40 GiB GPU: each stage needs 65.71 GiB.
  options = PlanOptions();
  options.pp = 2;
  options.gpu_memory_bytes = int64_t{40} << 30;
  plan = PlanCapacity(Spec(cfg::kLlama3_70B), options);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(plan.status().message().find("the weights need 65.71 GiB per GPU at stage 0 (layers "
                                         "0-39) of pp 2 x tp 1"),
            std::string::npos)
      << plan.status();
  // Activations that leave a stage no KV memory name that stage.
  options.tp = 4;
  options.gpu_memory_bytes = int64_t{80} << 30;
  options.max_num_batched_tokens = 400000;
  plan = PlanCapacity(Spec(cfg::kLlama3_70B), options);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(plan.status().message().find("stage 0 (layers 0-39): no memory left for the KV cache"),
            std::string::npos)
      << plan.status();
}

}  // namespace
}  // namespace kvserve
