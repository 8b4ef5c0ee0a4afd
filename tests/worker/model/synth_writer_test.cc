// kvserve synth's writer: the GGUF file and the Hugging Face directory both load through
// LoadModel, tokenize text the same way, and give the same logits (HF q/k rows permuted for
// rotate_half); bad shapes are refused with the flag named.

#include "worker/model/synth_writer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/gguf/gguf_writer.h"
#include "common/io/mapped_file.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util/scratch_dir.h"
#include "tests/worker/model/model_test_util.h"
#include "worker/model/loaded_model.h"

namespace kvserve {
namespace {

namespace fs = std::filesystem;

fs::path TempDir(const std::string& name) {
  const fs::path dir = fs::path(test_util::ScratchPath(name));
  fs::remove_all(dir);
  return dir;
}

SynthWriteOptions SmallModel(const std::string& name, DType dtype) {
  SynthWriteOptions o;
  o.model.num_layers = 2;
  o.model.hidden_size = 64;
  o.model.num_heads = 4;
  o.model.num_kv_heads = 2;
  o.model.intermediate_size = 96;
  o.model.vocab_size = 600;
  o.model.max_position_embeddings = 128;
  o.model.dtype = dtype;
  o.model.seed = 7;
  o.out_dir = TempDir(name).string();
  return o;
}

using testing_model::LastLogits;

class SynthFormatsTest : public ::testing::TestWithParam<DType> {};

TEST_P(SynthFormatsTest, GgufAndHfLoadAndAgree) {
  const SynthWriteOptions o = SmallModel(std::string(DTypeName(GetParam())), GetParam());
  absl::StatusOr<SynthOutputs> out = WriteSynthModel(o);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->gguf_path, o.out_dir + "/model.gguf");
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json",
                        "tokenizer_config.json", "generation_config.json"}) {
    EXPECT_TRUE(fs::exists(fs::path(out->hf_dir) / f)) << f;
  }
  absl::StatusOr<LoadedModel> gguf = LoadModel(out->gguf_path);
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  absl::StatusOr<LoadedModel> hf = LoadModel(out->hf_dir);
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ(gguf->config().vocab_size, 600);
  EXPECT_EQ(hf->config().num_kv_heads, 2);
  EXPECT_EQ(gguf->weights->token_embedding.dtype, GetParam());
  EXPECT_EQ(hf->weights->token_embedding.dtype, GetParam());

  // Both tokenizers split text the same way, into learned pieces (not just bytes).
  const std::string text = "The keeper waited for the first token, and Mia waved. Zoë 42!";
  absl::StatusOr<std::vector<TokenId>> ids_gguf = gguf->tokenizer->Encode(text);
  absl::StatusOr<std::vector<TokenId>> ids_hf = hf->tokenizer->Encode(text);
  ASSERT_TRUE(ids_gguf.ok() && ids_hf.ok());
  EXPECT_EQ(*ids_gguf, *ids_hf);
  EXPECT_EQ(ids_gguf->front(), 1);  // BOS
  EXPECT_LT(ids_gguf->size(), text.size() / 2);
  absl::StatusOr<std::string> back =
      gguf->tokenizer->Decode(*ids_gguf, DecodeOptions{.skip_special_tokens = true});
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, text);

  const std::vector<float> a = LastLogits(*gguf, *ids_gguf);
  const std::vector<float> b = LastLogits(*hf, *ids_hf);
  float max_diff = 0.0f, max_abs = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(a[i] - b[i]));
    max_abs = std::max(max_abs, std::fabs(a[i]));
  }
  EXPECT_GT(max_abs, 1e-3f);
  EXPECT_LT(max_diff, 1e-4f * std::max(1.0f, max_abs));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SynthFormatsTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16));

TEST(SynthWriterTest, HfRowsAreThePermutedGgufRows) {
  // Independent check of the rotate_half permutation on one head: HF row j*d/2 + k holds GGUF
  // row 2k + j (README of stories260K-hf).
  SynthWriteOptions o = SmallModel("perm", DType::kF32);
  absl::StatusOr<SynthOutputs> out = WriteSynthModel(o);
  ASSERT_TRUE(out.ok()) << out.status();
  absl::StatusOr<LoadedModel> gguf = LoadModel(out->gguf_path);
  absl::StatusOr<LoadedModel> hf = LoadModel(out->hf_dir);
  ASSERT_TRUE(gguf.ok() && hf.ok());
  const TensorView& g = gguf->weights->layers[1].wk;
  const TensorView& h = hf->weights->layers[1].wk;
  const int d = 16, cols = 64;
  const auto* gd = static_cast<const float*>(g.data);
  const auto* hd = static_cast<const float*>(h.data);
  for (int head = 0; head < 2; ++head) {
    for (int j = 0; j < 2; ++j) {
      for (int k = 0; k < d / 2; ++k) {
        const int hr = head * d + j * d / 2 + k, gr = head * d + 2 * k + j;
        ASSERT_EQ(0, std::memcmp(hd + hr * cols, gd + gr * cols, cols * 4)) << hr;
      }
    }
  }
  // The value rows are not permuted.
  EXPECT_EQ(0, std::memcmp(gguf->weights->layers[1].wv.data, hf->weights->layers[1].wv.data,
                           32 * cols * 4));
}

TEST(SynthWriterTest, GgufMetadataIsStandardLlama) {
  SynthWriteOptions o = SmallModel("q8", DType::kQ8_0);
  o.format = SynthFormat::kGguf;
  absl::StatusOr<SynthOutputs> out = WriteSynthModel(o);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->hf_dir.empty());
  absl::StatusOr<LoadedModel> m = LoadModel(out->gguf_path);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->weights->layers[0].wq.dtype, DType::kQ8_0);
  EXPECT_EQ(m->config().max_position_embeddings, 128);
  EXPECT_EQ(m->config().bos_token_id, 1);
  // The raw file holds the keys other GGUF engines read.
  absl::StatusOr<std::string> bytes = ReadFileToString(out->gguf_path);
  ASSERT_TRUE(bytes.ok());
  for (const char* key :
       {"general.architecture", "llama.context_length", "llama.embedding_length",
        "llama.block_count", "llama.feed_forward_length", "llama.rope.dimension_count",
        "llama.attention.head_count_kv", "llama.attention.layer_norm_rms_epsilon",
        "tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.scores",
        "tokenizer.ggml.token_type", "tokenizer.ggml.bos_token_id", "general.file_type"}) {
    EXPECT_NE(bytes->find(key), std::string::npos) << key;
  }
}

TEST(SynthWriterTest, HfConfigFields) {
  SynthWriteOptions o = SmallModel("cfg", DType::kBF16);
  o.format = SynthFormat::kHf;
  o.model.tie_word_embeddings = true;
  absl::StatusOr<SynthOutputs> out = WriteSynthModel(o);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE(out->gguf_path.empty());
  absl::StatusOr<std::string> text = ReadFileToString(out->hf_dir + "/config.json");
  ASSERT_TRUE(text.ok());
  const nlohmann::json c = nlohmann::json::parse(*text);
  EXPECT_EQ(c["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(c["torch_dtype"], "bfloat16");
  EXPECT_EQ(c["num_key_value_heads"], 2);
  EXPECT_EQ(c["tie_word_embeddings"], true);
  absl::StatusOr<LoadedModel> m = LoadModel(out->hf_dir);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->weights->output.data, m->weights->token_embedding.data);
}

TEST(SynthWriterTest, BadArgumentsNameTheFlag) {
  struct Case {
    void (*edit)(SynthWriteOptions&);
    const char* expected;
  };
  const Case cases[] = {
      {[](SynthWriteOptions& o) { o.model.num_kv_heads = 3; }, "--kv-heads 3 must divide"},
      {[](SynthWriteOptions& o) { o.model.num_heads = 5; }, "--heads 5 must divide --hidden 64"},
      {[](SynthWriteOptions& o) { o.model.num_heads = 64; }, "must be even"},
      {[](SynthWriteOptions& o) { o.model.num_layers = 0; }, "--layers must be at least 1"},
      {[](SynthWriteOptions& o) { o.model.vocab_size = 300; }, "--vocab 300 is too small"},
      {[](SynthWriteOptions& o) { o.model.dtype = DType::kQ8_0; }, "use --format gguf"},
      {[](SynthWriteOptions& o) {
         o.model.dtype = DType::kQ8_0;
         o.format = SynthFormat::kGguf;
         o.model.intermediate_size = 100;
       },
       "multiples of 32"},
      {[](SynthWriteOptions& o) { o.out_dir.clear(); }, "--out is required"},
  };
  for (const Case& c : cases) {
    SynthWriteOptions o = SmallModel("bad", DType::kF32);
    c.edit(o);
    absl::StatusOr<SynthOutputs> out = WriteSynthModel(o);
    ASSERT_FALSE(out.ok()) << c.expected;
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(out.status().message().find(c.expected), absl::string_view::npos)
        << out.status().message();
  }
  EXPECT_FALSE(ParseSynthFormat("onnx").ok());
  // An output directory under a regular file cannot be created; the error names it.
  SynthWriteOptions o = SmallModel("file", DType::kF32);
  fs::create_directories(o.out_dir);
  ASSERT_TRUE(WriteStringToFile(o.out_dir + "/x", "x").ok());
  o.out_dir += "/x/model";
  absl::StatusOr<SynthOutputs> out = WriteSynthModel(o);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find(o.out_dir), absl::string_view::npos)
      << out.status().message();
}

}  // namespace
}  // namespace kvserve
