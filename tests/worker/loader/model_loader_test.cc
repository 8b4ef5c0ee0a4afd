#include "worker/loader/model_loader.h"

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/gguf/gguf_file.h"
#include "common/gguf/gguf_writer.h"
#include "gtest/gtest.h"
#include "tests/test_util/scratch_dir.h"
#include "worker/loader/safetensors_writer.h"

namespace kvserve {
namespace {

namespace fs = std::filesystem;

const std::string kShared = KVSERVE_SHARED_DIR;
const std::string kGguf = kShared + "/models/stories260K/stories260K.gguf";
const std::string kHfDir = kShared + "/models/stories260K-hf";

bool SameBytes(const TensorView& a, const TensorView& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.nbytes() == b.nbytes() &&
         std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

bool InsideFile(const ModelWeights& w, const void* p) {
  const uint8_t* q = static_cast<const uint8_t*>(p);
  for (const MappedFile& f : w.files) {
    if (q >= f.data() && q < f.data() + f.size()) return true;
  }
  return false;
}

void ExpectStories260KConfig(const ModelConfig& c) {
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 172);
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_EQ(c.rope_theta, 10000.0f);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, (std::vector<TokenId>{2}));
}

/// Row `r` of a 2-D F32 view.
const float* Row(const TensorView& t, int64_t r) {
  return static_cast<const float*>(t.data) + r * t.shape[1];
}

/// Checks HF rows are GGUF rows under the rotate_half permutation of each head:
/// HF row h*hd + j*hd/2 + k == GGUF row h*hd + 2k + j.
void ExpectPermutedRows(const TensorView& hf, const TensorView& gguf, int heads, int hd) {
  ASSERT_EQ(hf.shape, gguf.shape);
  for (int h = 0; h < heads; ++h) {
    for (int j = 0; j < 2; ++j) {
      for (int k = 0; k < hd / 2; ++k) {
        EXPECT_EQ(std::memcmp(Row(hf, h * hd + j * hd / 2 + k), Row(gguf, h * hd + 2 * k + j),
                              hf.shape[1] * sizeof(float)),
                  0)
            << hf.name << " head " << h << " j " << j << " k " << k;
      }
    }
  }
}

TEST(ModelLoaderTest, Stories260KGgufAndHfHoldTheSameWeights) {
  absl::StatusOr<std::unique_ptr<ModelWeights>> g = LoadModelWeights(kGguf);
  ASSERT_TRUE(g.ok()) << g.status();
  absl::StatusOr<std::unique_ptr<ModelWeights>> h = LoadModelWeights(kHfDir);
  ASSERT_TRUE(h.ok()) << h.status();
  const ModelWeights& gw = **g;
  const ModelWeights& hw = **h;
  ExpectStories260KConfig(gw.config);
  ExpectStories260KConfig(hw.config);
  EXPECT_EQ(gw.format, "gguf");
  EXPECT_EQ(hw.format, "safetensors");
  EXPECT_EQ(gw.files.size(), 1u);
  EXPECT_EQ(hw.files.size(), 1u);
  EXPECT_EQ(gw.config.rope_style, RopeStyle::kInterleaved);
  EXPECT_EQ(hw.config.rope_style, RopeStyle::kHalfSplit);
  EXPECT_TRUE(hw.config.tie_word_embeddings);
  EXPECT_EQ(hw.output.data, hw.token_embedding.data);
  // The GGUF file stores an explicit output.weight; it equals the embedding.
  EXPECT_FALSE(gw.config.tie_word_embeddings);
  EXPECT_EQ(gw.output.name, "output.weight");
  EXPECT_TRUE(SameBytes(gw.output, gw.token_embedding));
  EXPECT_FALSE(gw.rope_freqs.present());

  EXPECT_EQ(gw.token_embedding.name, "token_embd.weight");
  EXPECT_EQ(hw.token_embedding.name, "model.embed_tokens.weight");
  EXPECT_EQ(gw.token_embedding.shape, (std::vector<int64_t>{512, 64}));
  EXPECT_TRUE(SameBytes(gw.token_embedding, hw.token_embedding));
  EXPECT_TRUE(InsideFile(gw, gw.token_embedding.data));
  EXPECT_TRUE(InsideFile(hw, hw.token_embedding.data));
  EXPECT_TRUE(SameBytes(gw.final_norm, hw.final_norm));
  EXPECT_FALSE(InsideFile(gw, gw.final_norm.data));  // converted copy
  ASSERT_EQ(gw.layers.size(), 5u);
  ASSERT_EQ(hw.layers.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    const LayerWeights& a = gw.layers[i];
    const LayerWeights& b = hw.layers[i];
    EXPECT_EQ(a.wk.name, absl::StrCat("blk.", i, ".attn_k.weight"));
    EXPECT_EQ(b.wk.name, absl::StrCat("model.layers.", i, ".self_attn.k_proj.weight"));
    EXPECT_EQ(a.wq.shape, (std::vector<int64_t>{64, 64}));
    EXPECT_EQ(a.wk.shape, (std::vector<int64_t>{32, 64}));
    EXPECT_EQ(a.w_down.shape, (std::vector<int64_t>{64, 172}));
    EXPECT_TRUE(SameBytes(a.wv, b.wv)) << i;
    EXPECT_TRUE(SameBytes(a.wo, b.wo)) << i;
    EXPECT_TRUE(SameBytes(a.w_gate, b.w_gate)) << i;
    EXPECT_TRUE(SameBytes(a.w_up, b.w_up)) << i;
    EXPECT_TRUE(SameBytes(a.w_down, b.w_down)) << i;
    EXPECT_TRUE(SameBytes(a.attn_norm, b.attn_norm)) << i;
    EXPECT_TRUE(SameBytes(a.ffn_norm, b.ffn_norm)) << i;
    EXPECT_FALSE(SameBytes(a.wq, b.wq)) << i;  // permuted
    ExpectPermutedRows(b.wq, a.wq, 8, 8);
    ExpectPermutedRows(b.wk, a.wk, 4, 8);
    EXPECT_FALSE(a.bq.present());
    EXPECT_TRUE(InsideFile(gw, a.wq.data));
    EXPECT_TRUE(InsideFile(hw, b.w_down.data));
  }
  EXPECT_EQ(gw.TotalBytes(), hw.TotalBytes() + 512 * 64 * 4);  // GGUF counts its own output
}

// ---- Synthetic models ---------------------------------------------------------------------

/// A tiny llama: hidden 32, intermediate 64, 2 layers, 4 heads, 2 KV heads, head_dim 8, vocab 16.
constexpr int kHidden = 32, kInter = 64, kLayers = 2, kHeads = 4, kKv = 2, kHd = 8, kVocab = 16;

/// Deterministic values for tensor number `seed`: small multiples of 1/8 (exact in every type).
float Value(int seed, int64_t i) { return static_cast<float>((seed * 7 + i * 3) % 17 - 8) / 8.0f; }

/// `n` elements encoded as `dtype`.
std::string Encode(DType dtype, int64_t n, int seed) {
  std::string out;
  if (dtype == DType::kQ8_0) {
    for (int64_t b = 0; b < n / 32; ++b) {
      const uint16_t d = FloatToHalf(0.125f);
      out.append(reinterpret_cast<const char*>(&d), 2);
      for (int j = 0; j < 32; ++j) out.push_back(static_cast<char>(Value(seed, b * 32 + j) * 8));
    }
    return out;
  }
  for (int64_t i = 0; i < n; ++i) {
    const float v = Value(seed, i);
    if (dtype == DType::kF32) {
      out.append(reinterpret_cast<const char*>(&v), 4);
    } else {
      const uint16_t h = dtype == DType::kF16 ? FloatToHalf(v) : FloatToBF16(v);
      out.append(reinterpret_cast<const char*>(&h), 2);
    }
  }
  return out;
}

struct TensorSpec {
  std::string gguf_name;
  std::string hf_name;
  std::vector<int64_t> shape;  // outermost first
  bool matrix;
};

std::vector<TensorSpec> TinySpecs(bool with_bias) {
  std::vector<TensorSpec> s = {
      {"token_embd.weight", "model.embed_tokens.weight", {kVocab, kHidden}, true},
      {"output_norm.weight", "model.norm.weight", {kHidden}, false},
      {"output.weight", "lm_head.weight", {kVocab, kHidden}, true}};
  for (int i = 0; i < kLayers; ++i) {
    const std::string g = absl::StrCat("blk.", i, ".");
    const std::string h = absl::StrCat("model.layers.", i, ".");
    const std::vector<TensorSpec> layer = {
        {g + "attn_norm.weight", h + "input_layernorm.weight", {kHidden}, false},
        {g + "attn_q.weight", h + "self_attn.q_proj.weight", {kHeads * kHd, kHidden}, true},
        {g + "attn_k.weight", h + "self_attn.k_proj.weight", {kKv * kHd, kHidden}, true},
        {g + "attn_v.weight", h + "self_attn.v_proj.weight", {kKv * kHd, kHidden}, true},
        {g + "attn_output.weight", h + "self_attn.o_proj.weight", {kHidden, kHeads * kHd}, true},
        {g + "ffn_norm.weight", h + "post_attention_layernorm.weight", {kHidden}, false},
        {g + "ffn_gate.weight", h + "mlp.gate_proj.weight", {kInter, kHidden}, true},
        {g + "ffn_up.weight", h + "mlp.up_proj.weight", {kInter, kHidden}, true},
        {g + "ffn_down.weight", h + "mlp.down_proj.weight", {kHidden, kInter}, true}};
    s.insert(s.end(), layer.begin(), layer.end());
    if (with_bias) {
      s.push_back({g + "attn_q.bias", h + "self_attn.q_proj.bias", {kHeads * kHd}, false});
      s.push_back({g + "attn_k.bias", h + "self_attn.k_proj.bias", {kKv * kHd}, false});
      s.push_back({g + "attn_v.bias", h + "self_attn.v_proj.bias", {kKv * kHd}, false});
    }
  }
  return s;
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

/// A tiny GGUF model: matrices in `matrix_dtype`, norms in F16; `skip` omits one tensor.
GgufWriter TinyGguf(DType matrix_dtype, const std::string& skip = "") {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetU32("llama.context_length", 128);
  w.SetU32("llama.embedding_length", kHidden);
  w.SetU32("llama.feed_forward_length", kInter);
  w.SetU32("llama.attention.head_count", kHeads);
  w.SetU32("llama.attention.head_count_kv", kKv);
  w.SetU32("llama.block_count", kLayers);
  w.SetF32("llama.attention.layer_norm_rms_epsilon", 1e-6f);
  std::vector<std::string> tokens;
  for (int i = 0; i < kVocab; ++i) tokens.push_back(absl::StrCat("t", i));
  w.SetStringArray("tokenizer.ggml.tokens", tokens);
  w.SetU32("tokenizer.ggml.bos_token_id", 1);
  w.SetU32("tokenizer.ggml.eos_token_id", 2);
  int seed = 0;
  for (const TensorSpec& s : TinySpecs(false)) {
    ++seed;
    if (s.gguf_name == skip) continue;
    const DType dt = s.matrix ? matrix_dtype : DType::kF16;
    w.AddTensor(s.gguf_name, GgmlTypeOf(dt), std::vector<int64_t>(s.shape.rbegin(), s.shape.rend()),
                Encode(dt, Numel(s.shape), seed));
  }
  return w;
}

std::string TempPath(const std::string& name) { return test_util::ScratchPath(name); }

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadGgufBytes(const GgufWriter& w,
                                                            const std::string& name) {
  EXPECT_TRUE(w.WriteFile(TempPath(name)).ok());
  return LoadModelWeights(TempPath(name));
}

void ExpectError(const absl::Status& s, const std::string& what) {
  ASSERT_FALSE(s.ok()) << "expected: " << what;
  EXPECT_NE(s.message().find(what), std::string::npos) << s;
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << s;
}

class TinyGgufTest : public testing::TestWithParam<DType> {};

TEST_P(TinyGgufTest, LoadsWithFileDtypeAndZeroCopyViews) {
  const DType dt = GetParam();
  const std::string name = "tiny_" + std::string(DTypeName(dt)) + ".gguf";
  absl::StatusOr<std::unique_ptr<ModelWeights>> w = LoadGgufBytes(TinyGguf(dt), name);
  ASSERT_TRUE(w.ok()) << w.status();
  absl::StatusOr<GgufFile> ref = GgufFile::Open(TempPath(name));  // independent second mapping
  ASSERT_TRUE(ref.ok());
  const ModelWeights& m = **w;
  EXPECT_EQ(m.config.num_kv_heads, kKv);
  EXPECT_EQ(m.config.vocab_size, kVocab);
  EXPECT_FALSE(m.config.tie_word_embeddings);
  ASSERT_EQ(m.files.size(), 1u);
  auto check_matrix = [&](const TensorView& v, const std::vector<int64_t>& shape) {
    EXPECT_EQ(v.dtype, dt) << v.name;
    EXPECT_EQ(v.shape, shape) << v.name;
    const GgufTensorInfo* info = ref->FindTensor(v.name);
    ASSERT_NE(info, nullptr) << v.name;
    // Zero-copy: the view points at the same offset of the loader's own mapping.
    EXPECT_EQ(static_cast<const uint8_t*>(v.data) - m.files[0].data(),
              info->data - ref->file().data())
        << v.name;
    EXPECT_EQ(static_cast<uint64_t>(v.nbytes()), info->nbytes) << v.name;
  };
  check_matrix(m.token_embedding, {kVocab, kHidden});
  check_matrix(m.output, {kVocab, kHidden});
  for (const LayerWeights& l : m.layers) {
    check_matrix(l.wq, {kHeads * kHd, kHidden});
    check_matrix(l.wk, {kKv * kHd, kHidden});
    check_matrix(l.wo, {kHidden, kHeads * kHd});
    check_matrix(l.w_down, {kHidden, kInter});
    EXPECT_EQ(l.attn_norm.dtype, DType::kF32);
    EXPECT_EQ(l.attn_norm.shape, (std::vector<int64_t>{kHidden}));
  }
  // Norms: F16 in the file, converted to F32 (values are exact in F16).
  const float* norm = static_cast<const float*>(m.final_norm.data);
  EXPECT_EQ(m.final_norm.name, "output_norm.weight");
  for (int i = 0; i < kHidden; ++i) EXPECT_EQ(norm[i], Value(2, i)) << i;
}

INSTANTIATE_TEST_SUITE_P(Dtypes, TinyGgufTest,
                         testing::Values(DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0),
                         [](const testing::TestParamInfo<DType>& p) {
                           return std::string(DTypeName(p.param));
                         });

// Every dtype is written as a GGUF type that loads back as that dtype, the types are those of the
// GGUF specification's numbering, and a type kvserve does not load maps to none.
TEST(ModelLoaderTest, GgmlTypesAndDTypesMapBothWays) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1,
                  DType::kQ5_0, DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    SCOPED_TRACE(DTypeName(d));
    EXPECT_EQ(DTypeFromGgml(GgmlTypeOf(d)), d);
  }
  EXPECT_EQ(static_cast<uint32_t>(GgmlTypeOf(DType::kQ4_K)), 12u);
  EXPECT_EQ(static_cast<uint32_t>(GgmlTypeOf(DType::kBF16)), 30u);
  EXPECT_EQ(DTypeFromGgml(static_cast<GgmlType>(9)), std::nullopt);  // Q8_1: not loaded
}

TEST(ModelLoaderTest, GgufTiedEmbeddingAndRopeFreqs) {
  GgufWriter w = TinyGguf(DType::kF16, "output.weight");
  w.AddTensor("rope_freqs.weight", GgmlType::kF32, {kHd / 2}, Encode(DType::kF32, kHd / 2, 99));
  absl::StatusOr<std::unique_ptr<ModelWeights>> m = LoadGgufBytes(w, "tied.gguf");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE((*m)->config.tie_word_embeddings);
  EXPECT_EQ((*m)->output.data, (*m)->token_embedding.data);
  ASSERT_TRUE((*m)->rope_freqs.present());
  EXPECT_EQ((*m)->rope_freqs.shape, (std::vector<int64_t>{kHd / 2}));
  EXPECT_EQ(static_cast<const float*>((*m)->rope_freqs.data)[3], Value(99, 3));
}

TEST(ModelLoaderTest, GgufErrors) {
  const std::string dir = test_util::TestScratchDir() + "/";
  ExpectError(LoadGgufBytes(TinyGguf(DType::kF32, "blk.1.ffn_up.weight"), "missing.gguf").status(),
              dir + "missing.gguf: missing tensor 'blk.1.ffn_up.weight'");
  {
    GgufWriter w = TinyGguf(DType::kF32, "blk.1.attn_k.weight");
    w.AddTensor("blk.1.attn_k.weight", GgmlType::kF32, {30, 16}, std::string(30 * 16 * 4, 0));
    ExpectError(LoadGgufBytes(w, "shape.gguf").status(),
                dir +
                    "shape.gguf: tensor 'blk.1.attn_k.weight' has shape [16, 30], expected "
                    "[16, 32]");
  }
  {
    GgufWriter w = TinyGguf(DType::kF32, "output_norm.weight");
    w.AddTensor("output_norm.weight", GgmlType::kQ8_0, {kHidden}, std::string(34, 0));
    ExpectError(LoadGgufBytes(w, "qnorm.gguf").status(),
                dir + "qnorm.gguf: tensor 'output_norm.weight' has type q8_0");
  }
  {
    GgufWriter no_tok;
    no_tok.SetString("general.architecture", "llama");
    ExpectError(LoadGgufBytes(no_tok, "notok.gguf").status(),
                dir + "notok.gguf: no tokenizer in GGUF metadata (tokenizer.ggml.tokens)");
  }
  {
    GgufWriter w = TinyGguf(DType::kF32);
    w.SetString("general.architecture", "gemma");
    ExpectError(LoadGgufBytes(w, "gemma.gguf").status(),
                dir +
                    "gemma.gguf: unsupported GGUF architecture 'gemma' (supported: llama, qwen3, "
                    "qwen3moe, deepseek2)");
  }
  {
    // A K-quant row must be whole 256-element super-blocks: hidden 32 is not.
    GgufWriter w = TinyGguf(DType::kF32, "blk.0.attn_q.weight");
    w.AddTensor("blk.0.attn_q.weight", GgmlType::kQ4_K, {kHidden, kHeads * kHd},
                std::string(144 * kHeads * kHd / 8, 0));
    ExpectError(LoadGgufBytes(w, "q4k_row.gguf").status(),
                dir +
                    "q4k_row.gguf: tensor 'blk.0.attn_q.weight' of type Q4_K has row length 32, "
                    "not a multiple of the block size 256");
  }
  ExpectError(LoadModelWeights(dir + "does_not_exist.gguf").status(),
              dir + "does_not_exist.gguf: no such file or directory");
  {
    GgufWriter w = TinyGguf(DType::kF32);
    std::string bytes = w.Serialize();
    bytes.resize(bytes.size() - 1);
    ASSERT_TRUE(WriteStringToFile(dir + "cut.gguf", bytes).ok());
    ExpectError(LoadModelWeights(dir + "cut.gguf").status(), dir + "cut.gguf: tensor ");
  }
}

// ---- Hugging Face directories -------------------------------------------------------------

std::string TinyConfig(const std::string& model_type, bool tied) {
  const std::string arch = model_type == "qwen2" ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
  return absl::StrCat(R"({"architectures": [")", arch, R"("], "model_type": ")", model_type,
                      R"(", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 16,
      "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "bos_token_id": 1,
      "eos_token_id": 2, "tie_word_embeddings": )",
                      tied ? "true" : "false", "}");
}

/// Writes a tiny HF model dir; tensors go to `shards` files (round robin) when shards > 1.
std::string MakeHfDir(const std::string& name, const std::string& model_type, DType dt, int shards,
                      const std::string& skip = "") {
  const std::string dir = TempPath(name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  const bool bias = model_type == "qwen2";
  EXPECT_TRUE(WriteStringToFile(dir + "/config.json", TinyConfig(model_type, false)).ok());
  EXPECT_TRUE(WriteStringToFile(dir + "/tokenizer.json", "{}").ok());
  std::vector<SafetensorsWriter> writers(shards);
  std::string weight_map;
  int seed = 0;
  for (const TensorSpec& s : TinySpecs(bias)) {
    ++seed;
    if (s.hf_name == skip) continue;
    const DType t = s.matrix ? dt : DType::kBF16;
    const int shard = seed % shards;
    writers[shard].AddTensor(s.hf_name, t, s.shape, Encode(t, Numel(s.shape), seed));
    absl::StrAppend(&weight_map, weight_map.empty() ? "" : ", ", "\"", s.hf_name,
                    "\": \"model-0000", shard + 1, "-of-0000", shards, ".safetensors\"");
  }
  if (shards == 1) {
    EXPECT_TRUE(writers[0].WriteFile(dir + "/model.safetensors").ok());
  } else {
    for (int i = 0; i < shards; ++i) {
      EXPECT_TRUE(writers[i]
                      .WriteFile(absl::StrCat(dir, "/model-0000", i + 1, "-of-0000", shards,
                                              ".safetensors"))
                      .ok());
    }
    EXPECT_TRUE(WriteStringToFile(dir + "/model.safetensors.index.json",
                                  absl::StrCat(R"({"metadata": {"total_size": 0}, "weight_map": {)",
                                               weight_map, "}}"))
                    .ok());
  }
  return dir;
}

TEST(ModelLoaderTest, HfBf16Qwen2WithBiases) {
  const std::string dir = MakeHfDir("qwen2_bf16", "qwen2", DType::kBF16, 1);
  absl::StatusOr<std::unique_ptr<ModelWeights>> w = LoadModelWeights(dir);
  ASSERT_TRUE(w.ok()) << w.status();
  const ModelWeights& m = **w;
  EXPECT_TRUE(m.config.qkv_bias);
  EXPECT_EQ(m.config.architecture, "qwen2");
  EXPECT_EQ(m.layers[1].wq.dtype, DType::kBF16);
  EXPECT_EQ(m.layers[1].wq.shape, (std::vector<int64_t>{kHeads * kHd, kHidden}));
  EXPECT_TRUE(InsideFile(m, m.layers[1].wq.data));
  ASSERT_TRUE(m.layers[1].bk.present());
  EXPECT_EQ(m.layers[1].bk.dtype, DType::kF32);
  EXPECT_EQ(m.layers[1].bk.shape, (std::vector<int64_t>{kKv * kHd}));
  EXPECT_EQ(m.layers[1].bk.name, "model.layers.1.self_attn.k_proj.bias");
  EXPECT_EQ(m.output.name, "lm_head.weight");
  // The BF16 bias was converted to F32: compare against the encoder's values (exact in BF16).
  const std::vector<TensorSpec> specs = TinySpecs(true);
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].hf_name != "model.layers.1.self_attn.k_proj.bias") continue;
    const float* b = static_cast<const float*>(m.layers[1].bk.data);
    for (int j = 0; j < kKv * kHd; ++j) EXPECT_EQ(b[j], Value(static_cast<int>(i) + 1, j));
  }
}

TEST(ModelLoaderTest, HfShardedF16) {
  const std::string dir = MakeHfDir("sharded", "llama", DType::kF16, 2);
  absl::StatusOr<std::unique_ptr<ModelWeights>> w = LoadModelWeights(dir);
  ASSERT_TRUE(w.ok()) << w.status();
  const ModelWeights& m = **w;
  EXPECT_EQ(m.files.size(), 2u);
  EXPECT_EQ(m.layers[0].w_gate.dtype, DType::kF16);
  EXPECT_EQ(m.layers[0].w_gate.shape, (std::vector<int64_t>{kInter, kHidden}));
  EXPECT_FALSE(m.layers[0].bq.present());
  for (const LayerWeights& l : m.layers) {
    for (const TensorView* v : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      EXPECT_TRUE(InsideFile(m, v->data)) << v->name;
    }
  }
  // Both shards hold some tensors.
  bool in0 = false, in1 = false;
  for (const LayerWeights& l : m.layers) {
    for (const TensorView* v : {&l.wq, &l.wk, &l.wv, &l.wo}) {
      const uint8_t* p = static_cast<const uint8_t*>(v->data);
      in0 = in0 || (p >= m.files[0].data() && p < m.files[0].data() + m.files[0].size());
      in1 = in1 || (p >= m.files[1].data() && p < m.files[1].data() + m.files[1].size());
    }
  }
  EXPECT_TRUE(in0 && in1);
}

TEST(ModelLoaderTest, HfErrors) {
  {
    const std::string dir = MakeHfDir("missing_shard", "llama", DType::kF32, 2);
    fs::remove(dir + "/model-00002-of-00002.safetensors");
    ExpectError(LoadModelWeights(dir).status(),
                dir +
                    "/model.safetensors.index.json: cannot load shard "
                    "'model-00002-of-00002.safetensors': " +
                    dir + "/model-00002-of-00002.safetensors: cannot open");
  }
  {
    const std::string dir = MakeHfDir("no_tok", "llama", DType::kF32, 1);
    fs::remove(dir + "/tokenizer.json");
    ExpectError(LoadModelWeights(dir).status(), dir + ": missing tokenizer.json");
  }
  {
    const std::string dir =
        MakeHfDir("missing_tensor", "llama", DType::kF32, 1, "model.layers.1.mlp.up_proj.weight");
    ExpectError(LoadModelWeights(dir).status(),
                dir + "/model.safetensors: missing tensor 'model.layers.1.mlp.up_proj.weight'");
  }
  {
    const std::string dir = MakeHfDir("arch", "llama", DType::kF32, 1);
    ASSERT_TRUE(WriteStringToFile(dir + "/config.json",
                                  R"({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})")
                    .ok());
    ExpectError(LoadModelWeights(dir).status(),
                dir +
                    "/config.json: unsupported architecture 'gpt2' (supported: llama, mistral, "
                    "qwen2, qwen3, mixtral, qwen3_moe, deepseek_v2, deepseek_v3)");
  }
  {
    const std::string dir =
        MakeHfDir("bad_shape", "llama", DType::kF32, 1, "model.layers.0.self_attn.o_proj.weight");
    // Re-write the single file with a wrongly shaped o_proj appended.
    SafetensorsWriter w;
    int seed = 0;
    for (const TensorSpec& s : TinySpecs(false)) {
      ++seed;
      std::vector<int64_t> shape = s.shape;
      if (s.hf_name == "model.layers.0.self_attn.o_proj.weight") shape = {kHidden, 30};
      w.AddTensor(s.hf_name, DType::kF32, shape, Encode(DType::kF32, Numel(shape), seed));
    }
    ASSERT_TRUE(w.WriteFile(dir + "/model.safetensors").ok());
    ExpectError(LoadModelWeights(dir).status(),
                dir +
                    "/model.safetensors: tensor 'model.layers.0.self_attn.o_proj.weight' has "
                    "shape [32, 30], expected [32, 32]");
  }
  {
    const std::string dir = MakeHfDir("dtype", "llama", DType::kF32, 1);
    SafetensorsWriter w;
    w.AddTensor("model.embed_tokens.weight", "I64", {kVocab, kHidden},
                std::string(kVocab * kHidden * 8, 0));
    ASSERT_TRUE(w.WriteFile(dir + "/model.safetensors").ok());
    ExpectError(LoadModelWeights(dir).status(),
                dir +
                    "/model.safetensors: tensor 'model.embed_tokens.weight' has unsupported "
                    "dtype 'I64'");
  }
  {
    const std::string dir = MakeHfDir("no_weights", "llama", DType::kF32, 1);
    fs::remove(dir + "/model.safetensors");
    ExpectError(LoadModelWeights(dir).status(),
                dir + ": no model.safetensors or model.safetensors.index.json");
  }
  {
    const std::string dir = MakeHfDir("evil_index", "llama", DType::kF32, 2);
    ASSERT_TRUE(WriteStringToFile(dir + "/model.safetensors.index.json",
                                  R"({"weight_map": {"model.norm.weight": "../x.safetensors"}})")
                    .ok());
    ExpectError(LoadModelWeights(dir).status(),
                "weight_map entry 'model.norm.weight' names an invalid shard '../x.safetensors'");
  }
}

}  // namespace
}  // namespace kvserve
