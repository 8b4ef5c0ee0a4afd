#include "worker/loader/hf_config.h"

#include <string>
#include <vector>

#include "common/gguf/gguf_writer.h"
#include "gtest/gtest.h"
#include "tests/test_util/scratch_dir.h"

namespace kvserve {
namespace {

const std::string kShared = KVSERVE_SHARED_DIR;

constexpr char kQwen2[] = R"({
  "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 128,
  "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
  "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 4096,
  "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": true,
  "use_sliding_window": false, "sliding_window": 4096, "bos_token_id": 998,
  "eos_token_id": 999, "hidden_act": "silu", "rope_scaling": null})";

/// A minimal llama config with `extra` fields spliced in (each ending with a comma).
std::string Llama(const std::string& extra) {
  return "{" + extra + R"("model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 100})";
}

void ExpectError(const absl::StatusOr<ModelConfig>& c, const std::string& what) {
  ASSERT_FALSE(c.ok()) << "expected: " << what;
  EXPECT_NE(c.status().message().find(what), std::string::npos) << c.status();
}

TEST(HfConfigTest, LoadsStories260K) {
  absl::StatusOr<ModelConfig> c = LoadHfConfig(kShared + "/models/stories260K-hf");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "llama");
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->intermediate_size, 172);
  EXPECT_EQ(c->num_layers, 5);
  EXPECT_EQ(c->num_heads, 8);
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_EQ(c->vocab_size, 512);
  EXPECT_EQ(c->max_position_embeddings, 512);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_EQ(c->rope_theta, 10000.0f);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_EQ(c->rope_style, RopeStyle::kHalfSplit);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_EQ(c->eos_token_ids, (std::vector<TokenId>{2}));
}

TEST(HfConfigTest, Qwen2HasBiasAndOptionalWindow) {
  absl::StatusOr<ModelConfig> c = ParseHfConfig(kQwen2, R"({"eos_token_id": [999, 997]})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "qwen2");
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_EQ(c->sliding_window, 0);  // use_sliding_window false
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->rope_theta, 1e6f);
  EXPECT_EQ(c->eos_token_ids, (std::vector<TokenId>{999, 997}));
  std::string windowed = kQwen2;
  windowed.replace(windowed.find("\"use_sliding_window\": false"), 27,
                   "\"use_sliding_window\": true");
  c = ParseHfConfig(windowed, "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, 4096);
}

TEST(HfConfigTest, MistralDefaultsAndWindow) {
  const std::string mistral = R"({"architectures": ["MistralForCausalLM"], "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
    "head_dim": 32, "vocab_size": 100, "sliding_window": 4096, "eos_token_id": [2, 3]})";
  absl::StatusOr<ModelConfig> c = ParseHfConfig(mistral, "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "mistral");
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_EQ(c->num_kv_heads, 4);  // defaults to heads
  EXPECT_EQ(c->head_dim, 32);     // explicit, not hidden / heads
  EXPECT_EQ(c->bos_token_id, kNoToken);
  EXPECT_EQ(c->eos_token_ids, (std::vector<TokenId>{2, 3}));
  EXPECT_FALSE(c->tie_word_embeddings);
  std::string null_window = mistral;
  null_window.replace(null_window.find("4096"), 4, "null");
  c = ParseHfConfig(null_window, "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, 0);
}

TEST(HfConfigTest, RopeScaling) {
  absl::StatusOr<ModelConfig> c = ParseHfConfig(
      Llama(R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},)"),
      "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(c->rope_scaling.factor, 8.0f);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  c = ParseHfConfig(Llama(R"("rope_scaling": {"type": "linear", "factor": 2.0},)"), "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_EQ(c->rope_scaling.factor, 2.0f);
  ExpectError(ParseHfConfig(Llama(R"("rope_scaling": {"type": "yarn", "factor": 2.0},)"), ""),
              "config.json: unsupported rope_scaling type 'yarn' (supported: linear, llama3)");
  ExpectError(ParseHfConfig(Llama(R"("rope_scaling": {"type": "linear"},)"), ""),
              "config.json: rope_scaling: missing 'factor'");
}

TEST(HfConfigTest, Errors) {
  ExpectError(
      ParseHfConfig(R"({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})", ""),
      "config.json: unsupported architecture 'gpt2' (supported: llama, mistral, qwen2, qwen3, "
      "mixtral, qwen3_moe, deepseek_v2, deepseek_v3)");
  ExpectError(ParseHfConfig(R"({"architectures": ["GemmaForCausalLM"]})", ""),
              "config.json: unsupported architecture 'GemmaForCausalLM'");
  ExpectError(ParseHfConfig(Llama(R"("attention_bias": true,)"), ""),
              "config.json: 'attention_bias' true is not supported");
  ExpectError(ParseHfConfig(Llama(R"("mlp_bias": true,)"), ""),
              "config.json: 'mlp_bias' true is not supported");
  ExpectError(ParseHfConfig(Llama(R"("hidden_act": "gelu",)"), ""),
              "config.json: unsupported hidden_act \"gelu\"");
  ExpectError(ParseHfConfig(R"({"model_type": "llama"})", ""),
              "config.json: missing 'hidden_size'");
  ExpectError(ParseHfConfig(Llama(R"("num_key_value_heads": 3,)"), ""),
              "config.json: num_heads 4 is not a multiple of num_kv_heads 3");
  ExpectError(ParseHfConfig(Llama(R"("eos_token_id": 100,)"), ""),
              "config.json: eos_token_id 100 is outside the vocabulary of 100");
  ExpectError(ParseHfConfig(Llama(R"("num_key_value_heads": "2",)"), ""),
              "config.json: 'num_key_value_heads' must be an integer, got \"2\"");
  ExpectError(ParseHfConfig("{not json", ""), "config.json: invalid JSON");
  ExpectError(ParseHfConfig(Llama(""), "[]"), "generation_config.json: not a JSON object");
  ExpectError(LoadHfConfig(test_util::ScratchPath("no_such_dir")), "config.json");
}

TEST(HfConfigTest, GgufStories260K) {
  absl::StatusOr<GgufFile> f = GgufFile::Open(kShared + "/models/stories260K/stories260K.gguf");
  ASSERT_TRUE(f.ok()) << f.status();
  absl::StatusOr<ModelConfig> c = ModelConfigFromGguf(*f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "llama");
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->intermediate_size, 172);
  EXPECT_EQ(c->num_layers, 5);
  EXPECT_EQ(c->num_heads, 8);
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_EQ(c->vocab_size, 512);
  EXPECT_EQ(c->max_position_embeddings, 512);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_EQ(c->rope_theta, 10000.0f);
  EXPECT_EQ(c->rope_style, RopeStyle::kInterleaved);
  // This file carries an explicit output.weight (equal to the embedding), so it is not tied.
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_EQ(c->eos_token_ids, (std::vector<TokenId>{2}));
}

absl::StatusOr<ModelConfig> GgufConfigOf(const GgufWriter& w, const std::string& name) {
  const std::string path = test_util::ScratchPath(name);
  EXPECT_TRUE(w.WriteFile(path).ok());
  absl::StatusOr<GgufFile> f = GgufFile::Open(path);
  if (!f.ok()) return f.status();
  return ModelConfigFromGguf(*f);
}

GgufWriter MinimalGguf() {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetU32("llama.context_length", 256);
  w.SetU32("llama.embedding_length", 64);
  w.SetU32("llama.feed_forward_length", 96);
  w.SetU32("llama.attention.head_count", 4);
  w.SetU32("llama.block_count", 1);
  w.SetF32("llama.attention.layer_norm_rms_epsilon", 1e-6f);
  w.AddTensor("token_embd.weight", GgmlType::kF32, {64, 10}, std::string(64 * 10 * 4, '\0'));
  return w;
}

TEST(HfConfigTest, GgufDefaultsAndErrors) {
  GgufWriter w = MinimalGguf();
  absl::StatusOr<ModelConfig> c = GgufConfigOf(w, "min.gguf");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->rope_theta, 10000.0f);
  EXPECT_EQ(c->vocab_size, 10);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->bos_token_id, kNoToken);
  EXPECT_TRUE(c->eos_token_ids.empty());

  w.SetString("llama.rope.scaling.type", "linear");
  w.SetF32("llama.rope.scaling.factor", 4.0f);
  c = GgufConfigOf(w, "linear.gguf");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_EQ(c->rope_scaling.factor, 4.0f);

  w.SetString("llama.rope.scaling.type", "yarn");
  ExpectError(GgufConfigOf(w, "yarn.gguf"), "unsupported llama.rope.scaling.type 'yarn'");

  GgufWriter arch = MinimalGguf();
  arch.SetString("general.architecture", "falcon");
  ExpectError(
      GgufConfigOf(arch, "falcon.gguf"),
      "falcon.gguf: unsupported GGUF architecture 'falcon' (supported: llama, qwen3, qwen3moe, "
      "deepseek2)");

  GgufWriter missing;
  missing.SetString("general.architecture", "llama");
  ExpectError(GgufConfigOf(missing, "missing.gguf"),
              "missing.gguf: metadata key 'llama.context_length' is missing");

  GgufWriter rope = MinimalGguf();
  rope.SetU32("llama.attention.key_length", 16);
  rope.SetU32("llama.rope.dimension_count", 8);
  ExpectError(GgufConfigOf(rope, "rope.gguf"), "partial rotary embeddings are not supported");
}

}  // namespace
}  // namespace kvserve
