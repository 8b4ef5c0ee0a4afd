#include "worker/planner/model_spec.h"

#include <cmath>
#include <string>

#include "common/gguf/gguf_file.h"
#include "common/gguf/gguf_writer.h"
#include "gtest/gtest.h"
#include "tests/worker/planner/model_configs.h"
#include "tests/worker/planner/planner_test_util.h"
#include "worker/planner/capacity_planner.h"
#include "worker/planner/model_spec_loader.h"
#include "worker/planner/tensor_sharding.h"

namespace kvserve {
namespace {

namespace cfg = testing_configs;
using planner_testing::MakeTestDir;
using planner_testing::WriteSafetensors;
using planner_testing::WriteText;

ModelSpec Spec(const char* json) {
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfigJson(json, "config.json");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : ModelSpec();
}

void ExpectWithin(int64_t value, double reference, double tolerance) {
  EXPECT_LT(std::fabs(static_cast<double>(value) - reference) / reference, tolerance)
      << value << " vs " << reference;
}

TEST(ModelSpecTest, ReadsLlama3Config) {
  const ModelSpec spec = Spec(cfg::kLlama3_8B);
  EXPECT_EQ(spec.model_type, "llama");
  EXPECT_EQ(spec.num_layers, 32);
  EXPECT_EQ(spec.hidden_size, 4096);
  EXPECT_EQ(spec.num_heads, 32);
  EXPECT_EQ(spec.num_kv_heads, 8);
  EXPECT_EQ(spec.head_dim, 128);
  EXPECT_EQ(spec.intermediate_size, 14336);
  EXPECT_EQ(spec.vocab_size, 128256);
  EXPECT_EQ(spec.max_position_embeddings, 8192);
  EXPECT_FALSE(spec.tie_word_embeddings);
  EXPECT_FALSE(spec.IsMoe());
  EXPECT_FALSE(spec.IsMla());
  EXPECT_EQ(spec.checkpoint_dtype, WeightDType::kBF16);
  EXPECT_FALSE(spec.tensor_bytes.has_value());
}

// Published parameter counts (model cards / Hugging Face `num_parameters()`).
TEST(ModelSpecTest, ParameterCountsMatchPublishedSizes) {
  ExpectWithin(CountParameters(Spec(cfg::kLlama3_8B)).total(), 8.03e9, 0.01);
  EXPECT_EQ(CountParameters(Spec(cfg::kLlama3_8B)).total(), 8'030'261'248);
  EXPECT_EQ(CountParameters(Spec(cfg::kLlama2_7B)).total(), 6'738'415'616);
  ExpectWithin(CountParameters(Spec(cfg::kLlama3_70B)).total(), 70.6e9, 0.01);
  ExpectWithin(CountParameters(Spec(cfg::kMistral7B)).total(), 7.24e9, 0.01);
  ExpectWithin(CountParameters(Spec(cfg::kQwen2_7B)).total(), 7.62e9, 0.01);
  ExpectWithin(CountParameters(Spec(cfg::kMixtral8x7B)).total(), 46.7e9, 0.01);
  ExpectWithin(CountParameters(Spec(cfg::kDeepSeekV2)).total(), 236e9, 0.01);
  ExpectWithin(CountParameters(Spec(cfg::kDeepSeekV2Lite)).total(), 15.7e9, 0.01);
  // 671B without the 14B multi-token-prediction module.
  ExpectWithin(CountParameters(Spec(cfg::kDeepSeekV3)).total(), 671e9, 0.01);
}

TEST(ModelSpecTest, ParameterShardingKindsForLlama3) {
  const ShardedSizes p = CountParameters(Spec(cfg::kLlama3_8B));
  EXPECT_EQ(p.vocab_parallel, 2 * 128256 * 4096);
  EXPECT_EQ(p.kv_heads, int64_t{32} * 2 * 4096 * 1024);
  EXPECT_EQ(p.replicated, 32 * 2 * 4096 + 4096);
  EXPECT_EQ(p.split, int64_t{32} * (2 * 4096 * 4096 + 3 * 4096 * 14336));
}

TEST(ModelSpecTest, FamilySpecifics) {
  const ModelSpec mistral = Spec(cfg::kMistral7B);
  EXPECT_EQ(mistral.sliding_window, 4096);
  const ModelSpec qwen = Spec(cfg::kQwen2_7B);
  EXPECT_TRUE(qwen.qkv_bias);
  EXPECT_EQ(qwen.sliding_window, 0) << "use_sliding_window is false";
  const ModelSpec mixtral = Spec(cfg::kMixtral8x7B);
  EXPECT_EQ(mixtral.moe.num_routed_experts, 8);
  EXPECT_EQ(mixtral.moe.num_experts_per_tok, 2);
  EXPECT_EQ(mixtral.moe.moe_intermediate_size, 14336);
  EXPECT_EQ(mixtral.NumMoeLayers(), 32);
  const ModelSpec v2 = Spec(cfg::kDeepSeekV2);
  EXPECT_TRUE(v2.IsMla());
  EXPECT_EQ(v2.mla.kv_lora_rank, 512);
  EXPECT_EQ(v2.mla.qk_rope_head_dim, 64);
  EXPECT_EQ(v2.head_dim, 192);
  EXPECT_EQ(v2.NumMoeLayers(), 59);
  EXPECT_FALSE(v2.moe.router_bias);
  const ModelSpec v3 = Spec(cfg::kDeepSeekV3);
  EXPECT_EQ(v3.NumMoeLayers(), 58);
  EXPECT_TRUE(v3.moe.router_bias);
  EXPECT_EQ(v3.checkpoint_dtype, WeightDType::kFp8) << "quantization_config says fp8";
  EXPECT_EQ(Spec(cfg::kDeepSeekV2Lite).mla.q_lora_rank, 0);
}

TEST(ModelSpecTest, WeightDTypes) {
  EXPECT_EQ(WeightBytesForParams(WeightDType::kF32, 1000), 4000);
  EXPECT_EQ(WeightBytesForParams(WeightDType::kBF16, 1000), 2000);
  EXPECT_EQ(WeightBytesForParams(WeightDType::kFp8, 1000), 1000);
  EXPECT_EQ(WeightBytesForParams(WeightDType::kInt8, 1000), 1000);
  // 1280 weights: 640 bytes of nibbles + 10 groups × a 2-byte scale.
  EXPECT_EQ(WeightBytesForParams(WeightDType::kInt4, 1280), 660);
  EXPECT_EQ(*ParseWeightDType("int4"), WeightDType::kInt4);
  EXPECT_EQ(*ParseWeightDType("bfloat16"), WeightDType::kBF16);
  EXPECT_FALSE(ParseWeightDType("q4_k").ok());
  // No tensors: parameters × the config's dtype (bf16), or the override.
  const ModelSpec spec = Spec(cfg::kLlama3_8B);
  EXPECT_EQ(ModelWeightBytes(spec, std::nullopt).total(), 2 * 8'030'261'248);
  EXPECT_EQ(ModelWeightBytes(spec, WeightDType::kFp8).total(), 8'030'261'248);
}

void ExpectError(absl::string_view json, absl::string_view needle) {
  absl::StatusOr<ModelSpec> spec = ModelSpecFromConfigJson(std::string(json), "m/config.json");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << json;
  const std::string message(spec.status().message());
  EXPECT_NE(message.find("m/config.json"), std::string::npos) << message;
  EXPECT_NE(message.find(std::string(needle)), std::string::npos) << message;
}

TEST(ModelSpecTest, RejectsUnknownModelType) {
  ExpectError(cfg::kGpt2, "unsupported model_type \"gpt2\"");
  ExpectError(R"({"hidden_size": 64})", "model_type");
  // An unknown type with a MoE layout the planner does not know.
  ExpectError(R"({"model_type": "qwen2_moe", "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100, "num_experts": 8})",
              "num_experts");
}

TEST(ModelSpecTest, AcceptsUnknownTypeWithLlamaFields) {
  const ModelSpec spec = Spec(R"({"model_type": "granite", "hidden_size": 64,
      "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
      "vocab_size": 100})");
  EXPECT_TRUE(spec.assumed_llama_like);
  EXPECT_EQ(spec.num_kv_heads, 4);
  EXPECT_EQ(spec.head_dim, 16);
}

TEST(ModelSpecTest, RejectsBadFields) {
  ExpectError(R"({"model_type": "llama", "hidden_size": "big", "num_hidden_layers": 2,
      "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100})",
              "\"hidden_size\" must be a non-negative integer");
  ExpectError(R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
      "intermediate_size": 128, "vocab_size": 100})",
              "missing required field \"num_hidden_layers\"");
  ExpectError(R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 3, "intermediate_size": 128,
      "vocab_size": 100})",
              "num_key_value_heads");
  ExpectError(R"({"model_type": "llama", "hidden_size": 0, "num_hidden_layers": 2,
      "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100})",
              "hidden_size must be positive");
  ExpectError(R"({"model_type": "deepseek_v2", "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100})",
              "kv_lora_rank");
  ExpectError("{not json", "not a JSON object");
  ExpectError("[1, 2]", "not a JSON object");
}

// stories260K: V 512, H 64, 5 layers, 8 heads, 4 KV heads of 8, I 172, tied; f32 safetensors.
TEST(ModelSpecTest, Stories260KDirectoryHasExactTensorBytes) {
  absl::StatusOr<ModelSpec> spec = LoadModelSpec(planner_testing::Stories260KDir());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(CountParameters(*spec).total(), 260032);
  ASSERT_TRUE(spec->tensor_bytes.has_value());
  const ShardedSizes& bytes = *spec->tensor_bytes;
  EXPECT_EQ(bytes.total(), 1040128) << "sum of the safetensors data_offsets spans";
  EXPECT_EQ(bytes.total(), 260032 * 4);
  EXPECT_EQ(bytes.vocab_parallel, 512 * 64 * 4);
  EXPECT_EQ(bytes.replicated, (5 * 2 * 64 + 64) * 4);
  EXPECT_EQ(bytes.kv_heads, 5 * 2 * 32 * 64 * 4);
  EXPECT_EQ(ModelWeightBytes(*spec, std::nullopt).total(), 1040128);
  EXPECT_EQ(ModelWeightBytes(*spec, WeightDType::kBF16).total(), 520064);
}

TEST(ModelSpecTest, ConfigJsonAloneUsesTheParameterCount) {
  absl::StatusOr<ModelSpec> spec =
      LoadModelSpec(planner_testing::Stories260KDir() + "/config.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->tensor_bytes.has_value());
  EXPECT_EQ(spec->checkpoint_dtype, WeightDType::kF32);
  EXPECT_EQ(ModelWeightBytes(*spec, std::nullopt).total(), 1040128);
}

TEST(ModelSpecTest, Stories260KGguf) {
  absl::StatusOr<ModelSpec> spec = LoadModelSpec(planner_testing::Stories260KGguf());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model_type, "llama");
  EXPECT_EQ(spec->num_layers, 5);
  EXPECT_EQ(spec->hidden_size, 64);
  EXPECT_EQ(spec->num_heads, 8);
  EXPECT_EQ(spec->num_kv_heads, 4);
  EXPECT_EQ(spec->head_dim, 8);
  EXPECT_EQ(spec->intermediate_size, 172);
  EXPECT_EQ(spec->vocab_size, 512);
  // The GGUF conversion stores the (shared) output head as its own output.weight tensor, so
  // for this file it is untied: 260032 + 512 × 64 parameters, all f32.
  EXPECT_FALSE(spec->tie_word_embeddings);
  EXPECT_EQ(CountParameters(*spec).total(), 260032 + 512 * 64);
  ASSERT_TRUE(spec->tensor_bytes.has_value());
  EXPECT_EQ(spec->tensor_bytes->total(), (260032 + 512 * 64) * 4);
  // Independent reference: the GGUF parser's own tensor table.
  absl::StatusOr<GgufFile> file = GgufFile::Open(planner_testing::Stories260KGguf());
  ASSERT_TRUE(file.ok()) << file.status();
  int64_t total = 0;
  for (const GgufTensorInfo& tensor : file->tensors()) total += tensor.nbytes;
  EXPECT_EQ(spec->tensor_bytes->total(), total);
}

// A small DeepSeek-style GGUF written with llama.cpp's key names.
TEST(ModelSpecTest, Deepseek2Gguf) {
  GgufWriter writer;
  writer.SetString("general.architecture", "deepseek2");
  writer.SetU32("deepseek2.block_count", 2);
  writer.SetU32("deepseek2.embedding_length", 64);
  writer.SetU32("deepseek2.attention.head_count", 4);
  writer.SetU32("deepseek2.attention.head_count_kv", 4);
  writer.SetU32("deepseek2.feed_forward_length", 128);
  writer.SetU32("deepseek2.context_length", 256);
  writer.SetU32("deepseek2.attention.kv_lora_rank", 32);
  writer.SetU32("deepseek2.rope.dimension_count", 16);
  writer.SetU32("deepseek2.attention.key_length", 48);
  writer.SetU32("deepseek2.attention.value_length", 32);
  writer.SetU32("deepseek2.expert_count", 4);
  writer.SetU32("deepseek2.expert_shared_count", 1);
  writer.SetU32("deepseek2.expert_feed_forward_length", 16);
  writer.SetU32("deepseek2.expert_used_count", 2);
  writer.SetU32("deepseek2.leading_dense_block_count", 1);
  writer.SetU32("deepseek2.vocab_size", 100);
  writer.AddTensor("token_embd.weight", GgmlType::kF32, {64, 100}, std::string(64 * 100 * 4, 0));
  writer.AddTensor("blk.0.attn_kv_a_mqa.weight", GgmlType::kF32, {64, 48},
                   std::string(64 * 48 * 4, 0));
  writer.AddTensor("blk.1.exp_probs_b.bias", GgmlType::kF32, {4}, std::string(16, 0));
  writer.AddTensor("blk.1.attn_kv_b.weight", GgmlType::kF16, {32, 4 * 64},
                   std::string(32 * 256 * 2, 0));
  const std::string path = MakeTestDir() + "/tiny-deepseek.gguf";
  ASSERT_TRUE(writer.WriteFile(path).ok());

  absl::StatusOr<ModelSpec> spec = LoadModelSpec(path);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model_type, "deepseek_v3") << "exp_probs_b marks the V3 router";
  EXPECT_TRUE(spec->IsMla());
  EXPECT_EQ(spec->mla.kv_lora_rank, 32);
  EXPECT_EQ(spec->mla.qk_rope_head_dim, 16);
  EXPECT_EQ(spec->mla.qk_nope_head_dim, 32);
  EXPECT_EQ(spec->mla.v_head_dim, 32);
  EXPECT_EQ(spec->mla.q_lora_rank, 0);
  EXPECT_EQ(spec->moe.num_routed_experts, 4);
  EXPECT_EQ(spec->moe.num_shared_experts, 1);
  EXPECT_EQ(spec->NumMoeLayers(), 1);
  EXPECT_TRUE(spec->tie_word_embeddings) << "no output.weight";
  ASSERT_TRUE(spec->tensor_bytes.has_value());
  EXPECT_EQ(spec->tensor_bytes->vocab_parallel, 64 * 100 * 4);
  EXPECT_EQ(spec->tensor_bytes->replicated, 64 * 48 * 4 + 16);
  EXPECT_EQ(spec->tensor_bytes->split, 32 * 256 * 2);
  // 2 layers × (32 + 16) × 2 bytes, on every rank.
  EXPECT_EQ(*KvBytesPerToken(*spec, KvCacheDType::kBF16, 4), 192);

  GgufWriter other;
  other.SetString("general.architecture", "gpt2");
  ASSERT_TRUE(other.WriteFile(path).ok());
  absl::StatusOr<ModelSpec> bad = LoadModelSpec(path);
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("unsupported general.architecture \"gpt2\""),
            std::string::npos)
      << bad.status();
}

TEST(ModelSpecTest, ShardedSafetensorsIndexAndSkippedLayers) {
  const std::string dir = MakeTestDir();
  WriteText(dir + "/config.json", R"({"model_type": "llama", "hidden_size": 8,
      "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 16,
      "vocab_size": 10, "max_position_embeddings": 64, "torch_dtype": "bfloat16"})");
  WriteText(dir + "/model.safetensors.index.json", R"({"metadata": {"total_size": 0},
      "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                     "model.layers.0.self_attn.k_proj.weight": "model-00001-of-00002.safetensors",
                     "model.layers.0.mlp.up_proj.weight": "model-00002-of-00002.safetensors",
                     "model.norm.weight": "model-00002-of-00002.safetensors"}})");
  WriteSafetensors(dir + "/model-00001-of-00002.safetensors",
                   R"({"__metadata__": {"format": "pt"},
                       "model.embed_tokens.weight": {"dtype": "BF16", "shape": [10, 8],
                                                     "data_offsets": [0, 160]},
                       "model.layers.0.self_attn.k_proj.weight": {"dtype": "BF16",
                           "shape": [8, 8], "data_offsets": [160, 288]}})",
                   288);
  // The second shard also holds a tensor of a layer past num_hidden_layers (an MTP layer).
  WriteSafetensors(dir + "/model-00002-of-00002.safetensors",
                   R"({"model.layers.0.mlp.up_proj.weight": {"dtype": "BF16", "shape": [16, 8],
                                                            "data_offsets": [0, 256]},
                       "model.norm.weight": {"dtype": "BF16", "shape": [8],
                                             "data_offsets": [256, 272]},
                       "model.layers.1.mlp.up_proj.weight": {"dtype": "BF16", "shape": [16, 8],
                                                            "data_offsets": [272, 528]}})",
                   528);
  // A stray consolidated file must be ignored when the index exists.
  WriteSafetensors(dir + "/consolidated.safetensors", "{}", 0);
  absl::StatusOr<ModelSpec> spec = LoadModelSpec(dir);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(spec->tensor_bytes.has_value());
  EXPECT_EQ(spec->tensor_bytes->vocab_parallel, 160);
  EXPECT_EQ(spec->tensor_bytes->kv_heads, 128);
  EXPECT_EQ(spec->tensor_bytes->split, 256);
  EXPECT_EQ(spec->tensor_bytes->replicated, 16);
  EXPECT_EQ(spec->tensor_bytes->total(), 560);
}

TEST(ModelSpecTest, BadSafetensorsAreClearErrors) {
  const std::string dir = MakeTestDir();
  WriteText(dir + "/config.json", R"({"model_type": "llama", "hidden_size": 8,
      "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 16,
      "vocab_size": 10})");
  WriteText(dir + "/model.safetensors.index.json",
            R"({"weight_map": {"a": "model-00001-of-00001.safetensors"}})");
  absl::StatusOr<ModelSpec> spec = LoadModelSpec(dir);
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("model-00001-of-00001.safetensors"), std::string::npos)
      << spec.status();

  WriteSafetensors(dir + "/model-00001-of-00001.safetensors",
                   R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8);
  spec = LoadModelSpec(dir);
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(spec.status().message().find("outside"), std::string::npos) << spec.status();

  WriteText(dir + "/model-00001-of-00001.safetensors", std::string("\xff\xff\xff\xff", 4));
  spec = LoadModelSpec(dir);
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(spec.status().message().find("too short"), std::string::npos) << spec.status();

  EXPECT_EQ(LoadModelSpec(dir + "/nope").status().code(), absl::StatusCode::kNotFound);
}

TEST(TensorShardingTest, ClassifiesNames) {
  EXPECT_EQ(ClassifyHfTensor("model.embed_tokens.weight", 4), TensorSharding::kVocabParallel);
  EXPECT_EQ(ClassifyHfTensor("lm_head.weight", 4), TensorSharding::kVocabParallel);
  EXPECT_EQ(ClassifyHfTensor("model.layers.3.self_attn.v_proj.bias", 4), TensorSharding::kKvHeads);
  EXPECT_EQ(ClassifyHfTensor("model.layers.3.self_attn.kv_a_proj_with_mqa.weight", 4),
            TensorSharding::kReplicated);
  EXPECT_EQ(ClassifyHfTensor("model.layers.3.self_attn.kv_b_proj.weight", 4),
            TensorSharding::kSplit);
  EXPECT_EQ(ClassifyHfTensor("model.layers.3.mlp.gate.weight", 4), TensorSharding::kReplicated);
  EXPECT_EQ(ClassifyHfTensor("model.layers.3.mlp.gate_proj.weight", 4), TensorSharding::kSplit);
  EXPECT_EQ(ClassifyHfTensor("model.layers.1.block_sparse_moe.gate.weight", 4),
            TensorSharding::kReplicated);
  EXPECT_EQ(ClassifyHfTensor("model.layers.4.mlp.up_proj.weight", 4), TensorSharding::kSkip);
  EXPECT_EQ(ClassifyGgufTensor("blk.0.attn_k.weight", 4), TensorSharding::kKvHeads);
  EXPECT_EQ(ClassifyGgufTensor("blk.0.attn_kv_a_mqa.weight", 4), TensorSharding::kReplicated);
  EXPECT_EQ(ClassifyGgufTensor("blk.0.attn_k_b.weight", 4), TensorSharding::kSplit);
  EXPECT_EQ(ClassifyGgufTensor("blk.2.ffn_norm.weight", 4), TensorSharding::kReplicated);
  EXPECT_EQ(ClassifyGgufTensor("output.weight", 4), TensorSharding::kVocabParallel);
}

// The classification also says where a tensor sits, which decides its pipeline stage.
TEST(TensorShardingTest, PlacesTensorsInTheModel) {
  auto expect = [](TensorClass c, TensorSharding sharding, ModelPart part, int layer) {
    EXPECT_EQ(c.sharding, sharding);
    EXPECT_EQ(c.part, part);
    EXPECT_EQ(c.layer, layer);
  };
  expect(ClassifyHfTensor("model.embed_tokens.weight", 4), TensorSharding::kVocabParallel,
         ModelPart::kEmbedding, -1);
  expect(ClassifyHfTensor("lm_head.weight", 4), TensorSharding::kVocabParallel, ModelPart::kOutput,
         -1);
  expect(ClassifyHfTensor("model.norm.weight", 4), TensorSharding::kReplicated, ModelPart::kOutput,
         -1);
  expect(ClassifyHfTensor("model.layers.3.mlp.experts.7.down_proj.weight", 4),
         TensorSharding::kSplit, ModelPart::kLayer, 3);
  expect(ClassifyHfTensor("model.layers.0.input_layernorm.weight", 4), TensorSharding::kReplicated,
         ModelPart::kLayer, 0);
  // DeepSeek-V3's multi-token-prediction layer (layer 61 of 61) is not loaded.
  EXPECT_EQ(ClassifyHfTensor("model.layers.61.embed_tokens.weight", 61).sharding,
            TensorSharding::kSkip);
  expect(ClassifyGgufTensor("token_embd.weight", 4), TensorSharding::kVocabParallel,
         ModelPart::kEmbedding, -1);
  expect(ClassifyGgufTensor("output.weight", 4), TensorSharding::kVocabParallel, ModelPart::kOutput,
         -1);
  expect(ClassifyGgufTensor("output_norm.weight", 4), TensorSharding::kReplicated,
         ModelPart::kOutput, -1);
  expect(ClassifyGgufTensor("rope_freqs.weight", 4), TensorSharding::kReplicated, ModelPart::kOther,
         -1);
  expect(ClassifyGgufTensor("blk.2.ffn_down_exps.weight", 4), TensorSharding::kSplit,
         ModelPart::kLayer, 2);
}

TEST(TensorShardingTest, AddShardedBytesKeepsTotalsAndParts) {
  ShardedSizes sizes;
  AddShardedBytes(ClassifyGgufTensor("token_embd.weight", 2), 100, sizes);
  AddShardedBytes(ClassifyGgufTensor("blk.1.attn_k.weight", 2), 10, sizes);
  AddShardedBytes(ClassifyGgufTensor("blk.1.ffn_norm.weight", 2), 1, sizes);
  AddShardedBytes(ClassifyGgufTensor("output_norm.weight", 2), 2, sizes);
  AddShardedBytes(ClassifyGgufTensor("rope_freqs.weight", 2), 4, sizes);
  AddShardedBytes(ClassifyGgufTensor("blk.2.attn_k.weight", 2), 1000, sizes);  // skipped
  EXPECT_EQ(sizes.total(), 117);
  EXPECT_EQ(sizes.kv_heads, 10);
  EXPECT_EQ(sizes.replicated, 7);
  ASSERT_EQ(sizes.layers.size(), 2u);
  EXPECT_EQ(sizes.layers[0].total(), 0);
  EXPECT_EQ(sizes.layers[1].kv_heads, 10);
  EXPECT_EQ(sizes.layers[1].replicated, 1);
  EXPECT_EQ(sizes.embedding.vocab_parallel, 100);
  EXPECT_EQ(sizes.output.replicated, 2);
  EXPECT_EQ(sizes.other.replicated, 4);
}

// Llama-3-8B, bf16 from the parameter count. One layer: norms 2H, q and o 2·H·32·128, k and v
// 2·H·8·128, MLP 3·H·I; the embedding and the (untied) head V·H each; the final norm H.
TEST(StageWeightBytesTest, DenseStagesAddUpToTheWholeModel) {
  const ModelSpec spec = Spec(cfg::kLlama3_8B);
  const int64_t h = 4096;
  const int64_t layer = 2 * h + 2 * h * 32 * 128 + 2 * h * 8 * 128 + 3 * h * 14336;
  const int64_t vocab = int64_t{128256} * h;
  const ShardedAmounts first = StageWeightBytes(spec, std::nullopt, {0, 16});
  const ShardedAmounts last = StageWeightBytes(spec, std::nullopt, {16, 16});
  EXPECT_EQ(first.total(), 2 * (16 * layer + vocab));
  EXPECT_EQ(last.total(), 2 * (16 * layer + vocab + h));
  EXPECT_EQ(first.vocab_parallel, 2 * vocab);
  EXPECT_EQ(last.replicated, 2 * (16 * 2 * h + h));
  EXPECT_EQ(first.total() + last.total(), ModelWeightBytes(spec, std::nullopt).total());
  EXPECT_EQ(first.total() + last.total(), 2 * 8'030'261'248);
  // A middle stage holds only its layers.
  EXPECT_EQ(StageWeightBytes(spec, std::nullopt, {10, 12}).total(), 2 * 12 * layer);
  // The whole model as one stage is the totals.
  EXPECT_EQ(StageWeightBytes(spec, std::nullopt, {0, 32}).total(), 2 * 8'030'261'248);
  EXPECT_FALSE(StageWeightBytesExact(spec, std::nullopt, {0, 16}));
}

TEST(StageWeightBytesTest, TiedEmbeddingCountsOnTheFirstAndLastStage) {
  ModelSpec spec = Spec(cfg::kLlama3_8B);
  spec.tie_word_embeddings = true;
  const int64_t embedding = 2 * int64_t{128256} * 4096;
  const int64_t whole = ModelWeightBytes(spec, std::nullopt).total();
  EXPECT_EQ(whole, 2 * 8'030'261'248 - embedding);
  const int64_t first = StageWeightBytes(spec, std::nullopt, {0, 16}).total();
  const int64_t last = StageWeightBytes(spec, std::nullopt, {16, 16}).total();
  EXPECT_EQ(first + last, whole + embedding);
  EXPECT_EQ(StageWeightBytes(spec, std::nullopt, {16, 16}).vocab_parallel, embedding);
  // Three stages: the middle one holds no embedding.
  const int64_t middle = StageWeightBytes(spec, std::nullopt, {11, 11}).total();
  EXPECT_EQ(StageWeightBytes(spec, std::nullopt, {0, 11}).total() + middle +
                StageWeightBytes(spec, std::nullopt, {22, 10}).total(),
            whole + embedding);
  EXPECT_EQ(StageWeightBytes(spec, std::nullopt, {11, 11}).vocab_parallel, 0);
}

// DeepSeek-V3 at fp8 (one byte per parameter) over 31 + 30 layers. Layers 0-2 have a dense MLP,
// the rest 256 routed + 1 shared experts, so the stages differ beyond their layer counts.
TEST(StageWeightBytesTest, DeepSeekV3StagesDifferByLayerKind) {
  const ModelSpec spec = Spec(cfg::kDeepSeekV3);
  const int64_t h = 7168;
  // MLA: q_b, kv_b, o split; norms, q_a (+ its norm), kv_a (+ its norm) replicated.
  const int64_t attn_split = 1536 * 128 * (128 + 64) + 512 * 128 * (128 + 128) + 128 * 128 * h;
  const int64_t attn_replicated = 2 * h + h * 1536 + 1536 + h * (512 + 64) + 512;
  const int64_t dense_mlp = 3 * h * 18432;
  const int64_t experts = int64_t{256 + 1} * 3 * h * 2048;
  const int64_t router = h * 256 + 256;  // with the score-correction bias
  const int64_t vocab = int64_t{129280} * h;

  const ShardedAmounts first = StageWeightBytes(spec, WeightDType::kFp8, {0, 31});
  EXPECT_EQ(first.split, 31 * attn_split + 3 * dense_mlp + 28 * experts);
  EXPECT_EQ(first.replicated, 31 * attn_replicated + 28 * router);
  EXPECT_EQ(first.vocab_parallel, vocab);
  EXPECT_EQ(first.kv_heads, 0);
  const ShardedAmounts last = StageWeightBytes(spec, WeightDType::kFp8, {31, 30});
  EXPECT_EQ(last.split, 30 * attn_split + 30 * experts);
  EXPECT_EQ(last.replicated, 30 * attn_replicated + 30 * router + h);
  EXPECT_EQ(last.vocab_parallel, vocab);
  // Fewer layers, yet more weights: the last stage has no dense layers.
  EXPECT_GT(last.total(), first.total());
  EXPECT_EQ(first.total() + last.total(), ModelWeightBytes(spec, WeightDType::kFp8).total());

  // Per GPU at tp 8: split and vocab-parallel weights / 8, replicated whole (MLA has no k/v
  // projections split by head).
  EXPECT_EQ(*StageWeightBytesPerGpu(spec, WeightDType::kFp8, 8, {0, 31}),
            first.split / 8 + first.replicated + vocab / 8);
  EXPECT_EQ(*StageWeightBytesPerGpu(spec, WeightDType::kFp8, 8, {31, 30}),
            last.split / 8 + last.replicated + vocab / 8);
}

TEST(StageWeightBytesTest, TensorBytesSplitByStage) {
  // stories260K (see above) is tied; one f32 layer is norms 2·64, q and o 2·64·64, k and v
  // 2·64·32, MLP 3·64·172.
  absl::StatusOr<ModelSpec> spec = LoadModelSpec(planner_testing::Stories260KDir());
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(spec->tensor_bytes->has_placement());
  const int64_t layer = 4 * (2 * 64 + 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 172);
  const int64_t embedding = 4 * 512 * 64;
  EXPECT_TRUE(StageWeightBytesExact(*spec, std::nullopt, {0, 3}));
  EXPECT_EQ(StageWeightBytes(*spec, std::nullopt, {0, 3}).total(), 3 * layer + embedding);
  EXPECT_EQ(StageWeightBytes(*spec, std::nullopt, {3, 2}).total(), 2 * layer + 4 * 64 + embedding);
  EXPECT_EQ(StageWeightBytes(*spec, std::nullopt, {0, 5}).total(), 1040128);

  // The GGUF has its own output.weight: the last stage holds that, not a second embedding.
  spec = LoadModelSpec(planner_testing::Stories260KGguf());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(StageWeightBytes(*spec, std::nullopt, {0, 1}).total(), layer + embedding);
  EXPECT_EQ(StageWeightBytes(*spec, std::nullopt, {1, 1}).total(), layer);
  EXPECT_EQ(StageWeightBytes(*spec, std::nullopt, {2, 3}).total(), 3 * layer + 4 * 64 + embedding);
  EXPECT_EQ(StageWeightBytes(*spec, std::nullopt, {0, 1}).total() + layer +
                StageWeightBytes(*spec, std::nullopt, {2, 3}).total(),
            spec->tensor_bytes->total());
}

TEST(StageWeightBytesTest, TotalsWithoutPlacementFallBackToParameters) {
  absl::StatusOr<ModelSpec> spec = LoadModelSpec(planner_testing::Stories260KDir());
  ASSERT_TRUE(spec.ok()) << spec.status();
  ShardedSizes totals;
  totals.replicated = 999;  // e.g. a spec built from a loaded model's byte count alone
  spec->tensor_bytes = totals;
  EXPECT_TRUE(StageWeightBytesExact(*spec, std::nullopt, {0, 5}));
  EXPECT_EQ(StageWeightBytes(*spec, std::nullopt, {0, 5}).total(), 999);
  EXPECT_FALSE(StageWeightBytesExact(*spec, std::nullopt, {0, 3}));
  // f32 (the config's dtype) × the stage's parameters.
  const int64_t layer = 4 * (2 * 64 + 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 172);
  EXPECT_EQ(StageWeightBytes(*spec, std::nullopt, {0, 3}).total(), 3 * layer + 4 * 512 * 64);
}

}  // namespace
}  // namespace kvserve
