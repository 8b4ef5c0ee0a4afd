// K-quant (and q4_1/q5_0/q5_1) GGUF models end to end: kvserve synth writes a model as
// q4_k_m / q5_k_m / q6_k / ... together with its dequantized f32 twin; both load through the
// project's loader, and the CPU forward pass gives the same logits within a stated tolerance.
//
// Tolerance: the twin holds exactly the floats the quantized blocks decode to, so the two models
// compute the same function and differ only in how each matmul path rounds. A path that converts
// weight rows to f32 (the K-quants today) differs by f32 summation order alone: measured
// <= 5e-7 relative. The integer-dot paths (issue 13; q8_0 and q4_0 have them) quantize each
// activation row to 8 bits per 32-element block, measured here at 0.8-1.1 % of max |logit|
// for q8_0 and q4_0. The bound, max |logit - twin logit| <= 3e-2 * max |twin logit|, leaves ~3x
// room for that when K-quant integer kernels land. It still catches a wrong decoder or kernel:
// for the 4-bit types even the original unquantized weights (the same seed written as f32),
// which differ from the decoded ones by the quantization error alone (13-20 % of max |logit|),
// are checked to be farther away than the bound; a misplaced nibble or scale is far worse.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/packed_weights.h"
#include "tests/test_util/scratch_dir.h"
#include "tests/worker/model/model_test_util.h"
#include "worker/model/loaded_model.h"
#include "worker/model/synth_writer.h"

namespace kvserve {
namespace {

namespace fs = std::filesystem;

constexpr double kRelTolerance = 3e-2;

fs::path TempDir(const std::string& name) {
  const fs::path dir = fs::path(test_util::ScratchPath(name));
  fs::remove_all(dir);
  return dir;
}

// 2 layers, hidden 256, 4 heads, 2 kv heads, ffn 512, vocab 512: every row is whole super-blocks.
SynthWriteOptions Model(const std::string& name, DType dtype, WeightMix mix) {
  SynthWriteOptions o;
  o.model.num_layers = 2;
  o.model.hidden_size = 256;
  o.model.num_heads = 4;
  o.model.num_kv_heads = 2;
  o.model.intermediate_size = 512;
  o.model.vocab_size = 512;
  o.model.max_position_embeddings = 128;
  o.model.dtype = dtype;
  o.model.mix = mix;
  o.model.seed = 3;
  o.format = SynthFormat::kGguf;
  o.out_dir = TempDir(name).string();
  return o;
}

using testing_model::LastLogits;

double MaxAbs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

double MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double{a[i]} - b[i]));
  return m;
}

// Every matrix of `q` decodes to exactly the f32 values its twin `t` holds.
void ExpectTwinHoldsDecodedValues(const TensorView& q, const TensorView& t) {
  ASSERT_EQ(t.dtype, DType::kF32) << t.name;
  ASSERT_EQ(q.shape, t.shape) << q.name;
  const int64_t cols = q.shape.back();
  std::vector<float> row(cols);
  for (int64_t r = 0; r < q.numel() / cols; ++r) {
    cpu::ConvertRowToF32(static_cast<const uint8_t*>(q.data) + r * q.row_bytes(), q.dtype, cols,
                         row.data());
    ASSERT_EQ(0, std::memcmp(row.data(), static_cast<const float*>(t.data) + r * cols, cols * 4))
        << q.name << " row " << r;
  }
}

struct MixCase {
  const char* name;
  DType dtype;
  WeightMix mix;
};

class KQuantModelTest : public ::testing::TestWithParam<MixCase> {};

TEST_P(KQuantModelTest, LogitsMatchTheDequantizedTwin) {
  const MixCase& c = GetParam();
  SynthWriteOptions o = Model(c.name, c.dtype, c.mix);
  o.dequantized_twin_path = o.out_dir + "/twin.gguf";
  absl::StatusOr<SynthOutputs> out = WriteSynthModel(o);
  ASSERT_TRUE(out.ok()) << out.status();
  absl::StatusOr<LoadedModel> quant = LoadModel(out->gguf_path);
  ASSERT_TRUE(quant.ok()) << quant.status();
  absl::StatusOr<LoadedModel> twin = LoadModel(out->dequantized_twin_path);
  ASSERT_TRUE(twin.ok()) << twin.status();
  // The original weights before quantization: the same seed written as f32.
  SynthWriteOptions f = Model(std::string(c.name) + "_f32", DType::kF32, WeightMix::kUniform);
  absl::StatusOr<SynthOutputs> f_out = WriteSynthModel(f);
  ASSERT_TRUE(f_out.ok()) << f_out.status();
  absl::StatusOr<LoadedModel> original = LoadModel(f_out->gguf_path);
  ASSERT_TRUE(original.ok()) << original.status();

  // Stored types: the mix puts q6_k on output and on layer 1's attn_v / ffn_down
  // (use_more_bits of 2 layers: layer 1 only).
  const ModelWeights& qw = *quant->weights;
  const bool medium = c.mix == WeightMix::kKQuantMedium;
  EXPECT_EQ(qw.token_embedding.dtype, c.dtype);
  EXPECT_EQ(qw.output.dtype, medium ? DType::kQ6_K : c.dtype);
  EXPECT_EQ(qw.layers[0].wv.dtype, c.dtype);
  EXPECT_EQ(qw.layers[0].w_down.dtype, c.dtype);
  EXPECT_EQ(qw.layers[1].wv.dtype, medium ? DType::kQ6_K : c.dtype);
  EXPECT_EQ(qw.layers[1].w_down.dtype, medium ? DType::kQ6_K : c.dtype);
  EXPECT_EQ(qw.layers[1].wq.dtype, c.dtype);
  EXPECT_EQ(qw.layers[1].w_gate.dtype, c.dtype);

  const ModelWeights& tw = *twin->weights;
  ExpectTwinHoldsDecodedValues(qw.token_embedding, tw.token_embedding);
  ExpectTwinHoldsDecodedValues(qw.output, tw.output);
  for (int l = 0; l < 2; ++l) {
    for (auto [q, t] : {std::pair{&qw.layers[l].wq, &tw.layers[l].wq},
                        std::pair{&qw.layers[l].wv, &tw.layers[l].wv},
                        std::pair{&qw.layers[l].wo, &tw.layers[l].wo},
                        std::pair{&qw.layers[l].w_down, &tw.layers[l].w_down}}) {
      ExpectTwinHoldsDecodedValues(*q, *t);
    }
  }

  const std::string prompts[] = {"The keeper waited for the first token.",
                                 "Mia waved both of her hands, and the sea had been kind"};
  for (const std::string& text : prompts) {
    absl::StatusOr<std::vector<TokenId>> ids = quant->tokenizer->Encode(text);
    ASSERT_TRUE(ids.ok());
    const std::vector<float> lq = LastLogits(*quant, *ids, 2);
    const std::vector<float> lt = LastLogits(*twin, *ids, 2);
    const std::vector<float> lf = LastLogits(*original, *ids, 2);
    const double scale = MaxAbs(lt);
    const double twin_diff = MaxDiff(lq, lt);
    const double original_diff = MaxDiff(lq, lf);
    std::printf("%s: max |logit| %.4f, max diff vs twin %.3g (%.3g relative), vs unquantized "
                "weights %.3g (%.3g relative)\n",
                c.name, scale, twin_diff, twin_diff / scale, original_diff, original_diff / scale);
    EXPECT_GT(scale, 0.1);
    EXPECT_LE(twin_diff, kRelTolerance * scale) << text;
    if (std::string(c.name).starts_with("q4")) {
      EXPECT_GT(original_diff, 2 * kRelTolerance * scale) << "tolerance too loose to catch errors";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Mixes, KQuantModelTest,
    ::testing::Values(MixCase{"q4_k_m", DType::kQ4_K, WeightMix::kKQuantMedium},
                      MixCase{"q5_k_m", DType::kQ5_K, WeightMix::kKQuantMedium},
                      MixCase{"q6_k", DType::kQ6_K, WeightMix::kUniform},
                      MixCase{"q4_k", DType::kQ4_K, WeightMix::kUniform},
                      MixCase{"q4_1", DType::kQ4_1, WeightMix::kUniform},
                      MixCase{"q8_0", DType::kQ8_0, WeightMix::kUniform},
                      MixCase{"q4_0", DType::kQ4_0, WeightMix::kUniform},
                      MixCase{"q5_0", DType::kQ5_0, WeightMix::kUniform},
                      MixCase{"q5_1", DType::kQ5_1, WeightMix::kUniform}),
    [](const ::testing::TestParamInfo<MixCase>& p) { return std::string(p.param.name); });

// Rows that are not whole 256-element super-blocks (hidden 64, as in stories260K) fall back to
// q8_0, so such a q4_k_m file holds no K-quant tensor at all and still loads and runs.
TEST(KQuantModelTest, RowsShorterThanASuperBlockFallBackToQ8_0) {
  SynthWriteOptions o = Model("fallback", DType::kQ4_K, WeightMix::kKQuantMedium);
  o.model.hidden_size = 64;
  o.model.intermediate_size = 160;
  absl::StatusOr<SynthOutputs> out = WriteSynthModel(o);
  ASSERT_TRUE(out.ok()) << out.status();
  absl::StatusOr<LoadedModel> m = LoadModel(out->gguf_path);
  ASSERT_TRUE(m.ok()) << m.status();
  const ModelWeights& w = *m->weights;
  EXPECT_EQ(w.token_embedding.dtype, DType::kQ8_0);
  EXPECT_EQ(w.output.dtype, DType::kQ8_0);
  for (const LayerWeights& l : w.layers) {
    for (const TensorView* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      EXPECT_EQ(t->dtype, DType::kQ8_0) << t->name;
    }
  }
  absl::StatusOr<std::vector<TokenId>> ids = m->tokenizer->Encode("The keeper");
  ASSERT_TRUE(ids.ok());
  EXPECT_GT(MaxAbs(LastLogits(*m, *ids, 2)), 0.0);
}

// bf16 weights: where the matmul runs vdpbf16ps the CPU backend packs them at load
// (kernels/cpu/packed_weights.h) and rounds activations to bf16. The logits stay within the
// bound above of the f32 twin, and within 1 % of max |logit| of the file's layout
// (KVSERVE_CPU_PACK_WEIGHTS=0), which multiplies the same bf16 values in another order: alone
// that order changes a matmul's outputs by f32 rounding (the kernel tests bound it), but where a
// changed activation lands on the other side of a bf16 rounding boundary the next matmul sees a
// value one bf16 step away. Measured: 2-5e-7 for one to three tokens, 0.1-0.2 % of max |logit|
// for longer prompts, against 0.35-0.4 % between either and the f32 twin. Prefill runs the
// batched tiles, the last token's logits the decode ones.
// Prompts of the packed-layout tests, and the last logits of one with the weights left in the
// file's layout (KVSERVE_CPU_PACK_WEIGHTS=0 while LastLogits prepares them).
constexpr const char* kPackedPrompts[] = {"The keeper waited for the first token.", "Mia waved"};
std::vector<float> FileLayoutLogits(const LoadedModel& model, const std::vector<TokenId>& ids) {
  EXPECT_EQ(setenv("KVSERVE_CPU_PACK_WEIGHTS", "0", 1), 0);
  std::vector<float> logits = LastLogits(model, ids, 2);
  EXPECT_EQ(unsetenv("KVSERVE_CPU_PACK_WEIGHTS"), 0);
  return logits;
}

TEST(KQuantModelTest, PackedBf16MatchesTheFileLayoutAndTheTwin) {
  SynthWriteOptions o = Model("bf16", DType::kBF16, WeightMix::kUniform);
  o.dequantized_twin_path = o.out_dir + "/twin.gguf";
  absl::StatusOr<SynthOutputs> out = WriteSynthModel(o);
  ASSERT_TRUE(out.ok()) << out.status();
  absl::StatusOr<LoadedModel> bf16 = LoadModel(out->gguf_path);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  ASSERT_EQ(bf16->weights->layers[0].wq.dtype, DType::kBF16);
  absl::StatusOr<LoadedModel> twin = LoadModel(out->dequantized_twin_path);
  ASSERT_TRUE(twin.ok()) << twin.status();
  std::printf("bf16 weights packed on this path: %s\n",
              cpu::PackedLayoutSupported(DType::kBF16) ? "yes" : "no");
  for (const std::string text : kPackedPrompts) {
    absl::StatusOr<std::vector<TokenId>> ids = bf16->tokenizer->Encode(text);
    ASSERT_TRUE(ids.ok());
    const std::vector<float> packed = LastLogits(*bf16, *ids, 2);
    const std::vector<float> file_layout = FileLayoutLogits(*bf16, *ids);
    const std::vector<float> f32 = LastLogits(*twin, *ids, 2);
    const double scale = MaxAbs(f32);
    std::printf("bf16: max |logit| %.4f, packed vs file layout %.3g, vs f32 twin %.3g\n", scale,
                MaxDiff(packed, file_layout), MaxDiff(packed, f32));
    EXPECT_GT(scale, 0.1);
    EXPECT_LE(MaxDiff(packed, file_layout), 1e-2 * scale) << text;
    EXPECT_LE(MaxDiff(packed, f32), kRelTolerance * scale) << text;
  }
}

// Packed f32 (the avx512 path's FMA kernels, one chain per output) against the same file in its
// stored layout (sixteen-lane partial sums): both f32 throughout, so only the summation order
// differs, and the logits stay within f32 rounding of each other (no bf16 step to amplify it).
TEST(KQuantModelTest, PackedF32MatchesTheFileLayout) {
  SynthWriteOptions o = Model("f32", DType::kF32, WeightMix::kUniform);
  absl::StatusOr<SynthOutputs> out = WriteSynthModel(o);
  ASSERT_TRUE(out.ok()) << out.status();
  absl::StatusOr<LoadedModel> f32 = LoadModel(out->gguf_path);
  ASSERT_TRUE(f32.ok()) << f32.status();
  ASSERT_EQ(f32->weights->layers[0].wq.dtype, DType::kF32);
  std::printf("f32 weights packed on this path: %s\n",
              cpu::PackedLayoutSupported(DType::kF32) ? "yes" : "no");
  for (const std::string text : kPackedPrompts) {
    absl::StatusOr<std::vector<TokenId>> ids = f32->tokenizer->Encode(text);
    ASSERT_TRUE(ids.ok());
    const std::vector<float> packed = LastLogits(*f32, *ids, 2);
    const std::vector<float> file_layout = FileLayoutLogits(*f32, *ids);
    const double scale = MaxAbs(file_layout);
    std::printf("f32: max |logit| %.4f, packed vs file layout %.3g\n", scale,
                MaxDiff(packed, file_layout));
    EXPECT_GT(scale, 0.1);
    EXPECT_LE(MaxDiff(packed, file_layout), 1e-4 * scale) << text;
  }
}

TEST(KQuantModelTest, WriterRefusesBadMixes) {
  SynthWriteOptions o = Model("badmix", DType::kQ6_K, WeightMix::kKQuantMedium);
  absl::StatusOr<SynthOutputs> out = WriteSynthModel(o);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("needs q4_k or q5_k"), std::string::npos) << out.status();
  o = Model("badfmt", DType::kQ4_K, WeightMix::kUniform);
  o.format = SynthFormat::kBoth;
  out = WriteSynthModel(o);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("exists only in GGUF"), std::string::npos)
      << out.status();
}

}  // namespace
}  // namespace kvserve
