// End to end on the GPU: greedy tokens of stories260K through LlamaModel on the CUDA backend
// (f32 weights kept f32, bf16 activations) equal the CPU's for 64 tokens, launching every op and
// replaying decode steps from CUDA graphs; and, on machines with two or more GPUs, split over them
// with NCCL (tensor parallelism). Mixture-of-experts (Mixtral, Qwen3-MoE) and DeepSeek (latent
// attention with 576-wide cache rows and 32 heads on one row, DeepSeek routing, shared experts)
// models give the CPU's logits over a prefill and decode steps, with bf16 activations (within
// bf16 rounding) and with the f32 escape hatch (within f32 noise); and a bf16-activation forward
// pass runs no activation conversion per Linear. Skips without a CUDA device.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "tests/test_util/scratch_dir.h"
#include "worker/kv/kv_cache.h"
#include "worker/model/batch_builder.h"
#include "worker/model/llama_model.h"
#include "worker/model/loaded_model.h"
#include "worker/model/synth_writer.h"
#include "worker/tp/nccl_group.h"
#include "worker/tp/tp_model.h"

namespace kvserve {
namespace {

constexpr int kBlockSize = 16;

// Logits with bf16 activations (every GEMM input and output but the residual stream's and the
// logits', q/k/v, attention output, SiLU·mul rounded to bf16) against the CPU's f32 ones, over
// these 2-layer synthetic models (hidden 64-256, |logit| ~2): the largest difference measured on
// the simulator is 1.0e-2 of the largest |logit| (Qwen3 with a bf16 cache; 0.4-0.9e-2 for the
// others), against 2e-6 with f32 activations. The tolerance leaves a factor 3.
constexpr float kBf16ActivationTolerance = 3e-2f;

// A CUDA backend of the device under test that keeps activations in f32 (the escape hatch,
// BackendOptions::f32_activations), f32 weights kept f32: next to the CPU bit for bit but for
// summation order. Loaded once; null with `reason` set when there is no device.
Backend* CudaF32Activations(std::string* reason) {
  static std::unique_ptr<Backend> backend;
  static std::string why;
  static bool tried = false;
  if (!tried) {
    tried = true;
    BackendOptions options = testing_cuda::DeviceOptions();
    options.f32_activations = true;
    absl::StatusOr<std::unique_ptr<Backend>> b = LoadCudaBackend(options);
    if (b.ok()) {
      backend = std::move(*b);
    } else {
      why = std::string(b.status().message());
    }
  }
  *reason = why;
  return backend.get();
}

// Activation conversion / bias passes the CUDA library has queued so far (-1 if it does not say).
int64_t ActivationConversions() {
  absl::StatusOr<void*> fn =
      CudaLibrarySymbol("kvserve_cuda_activation_conversions", testing_cuda::UseSimulator());
  if (!fn.ok()) return -1;
  return reinterpret_cast<long long (*)()>(*fn)();
}

std::vector<TokenId> Greedy(const ModelWeights* weights, Backend* backend, int max_tokens,
                            DecodeGraphStats* graphs = nullptr) {
  cpu::ThreadPool pool(2);
  std::unique_ptr<LlamaModel> model = *LlamaModel::Create(weights, &pool, nullptr, backend);
  const int64_t blocks = (weights->config.max_position_embeddings + kBlockSize - 1) / kBlockSize;
  if (graphs != nullptr) {
    DecodeGraphOptions options;
    options.max_batch = 8;
    options.max_context_len = weights->config.max_position_embeddings;
    options.block_table_stride = blocks;
    absl::Status s = model->EnableDecodeGraphs(options);
    EXPECT_TRUE(s.ok()) << s;
  }
  // Block 0 stays out of the table: graph padding rows write to it.
  std::unique_ptr<KvCache> cache =
      *KvCache::Create(weights->config, blocks + 1, kBlockSize, KvCacheDType::kF32, backend);
  std::vector<int32_t> table(blocks);
  std::iota(table.rbegin(), table.rend(), 1);
  BatchBuilder builder;
  std::vector<TokenId> tokens = {1, 403, 407};  // BOS "Once upon"
  std::vector<float> logits(weights->config.vocab_size);
  int32_t pos = 0;
  std::vector<TokenId> out;
  std::span<const TokenId> feed(tokens);
  for (int i = 0; i <= max_tokens; ++i) {
    builder.Clear();
    builder.AddSequence(feed, pos, table, kBlockSize, true);
    absl::Status s = model->Forward(builder.Build(), *cache, logits.data());
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) break;
    pos += static_cast<int32_t>(feed.size());
    if (i == max_tokens) break;
    const TokenId next =
        static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(next);
    tokens.push_back(next);
    feed = std::span<const TokenId>(tokens).last(1);
  }
  if (graphs != nullptr) {
    *graphs = model->decode_graph_stats();
    EXPECT_TRUE(model->decode_graph_error().empty()) << model->decode_graph_error();
  }
  return out;
}

// Logits of a 21-token prefill and then 6 decode steps fed fixed tokens (the same on every
// backend), concatenated.
std::vector<float> StepLogits(const ModelWeights* weights, Backend* backend, KvCacheDType dtype) {
  cpu::ThreadPool pool(2);
  absl::StatusOr<std::unique_ptr<LlamaModel>> model =
      LlamaModel::Create(weights, &pool, nullptr, backend);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  const int64_t blocks = (weights->config.max_position_embeddings + kBlockSize - 1) / kBlockSize;
  std::unique_ptr<KvCache> cache =
      *KvCache::Create(weights->config, blocks, kBlockSize, dtype, backend);
  std::vector<int32_t> table(blocks);
  std::iota(table.begin(), table.end(), 0);
  const int vocab = weights->config.vocab_size;
  std::vector<TokenId> tokens(21);
  const size_t spread = static_cast<size_t>(std::min(590, vocab - 3));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(3 + i * 37 % spread);
  std::vector<float> all;
  std::vector<float> logits(vocab);
  BatchBuilder builder;
  int32_t pos = 0;
  std::span<const TokenId> feed(tokens);
  for (int step = 0; step < 7; ++step) {
    builder.Clear();
    builder.AddSequence(feed, pos, table, kBlockSize, true);
    absl::Status s = (*model)->Forward(builder.Build(), *cache, logits.data());
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) break;
    all.insert(all.end(), logits.begin(), logits.end());
    pos += static_cast<int32_t>(feed.size());
    tokens.push_back(static_cast<TokenId>(100 + step * 53));
    feed = std::span<const TokenId>(tokens).last(1);
  }
  return all;
}

// StepLogits on the CPU and on CUDA, with an f32 and a bf16 cache: with f32 activations
// (`gpu_f32`) within 1e-3 of the largest (`bf16_tolerance` with the bf16 cache), with bf16
// activations (`gpu`) within kBf16ActivationTolerance of it.
void ExpectStepLogitsMatchTheCpu(Backend* gpu, Backend* gpu_f32, const ModelWeights* weights,
                                 const std::string& what, float bf16_tolerance = 1e-3f) {
  ASSERT_EQ(gpu->activation_dtype(), DType::kBF16);
  ASSERT_EQ(gpu_f32->activation_dtype(), DType::kF32);
  for (KvCacheDType dtype : {KvCacheDType::kF32, KvCacheDType::kBF16}) {
    const std::vector<float> cpu = StepLogits(weights, nullptr, dtype);
    for (Backend* b : {gpu_f32, gpu}) {
      const std::vector<float> cuda = StepLogits(weights, b, dtype);
      ASSERT_EQ(cuda.size(), cpu.size());
      float scale = 1.0f, err = 0.0f;
      for (size_t i = 0; i < cpu.size(); ++i) {
        scale = std::max(scale, std::fabs(cpu[i]));
        err = std::max(err, std::fabs(cuda[i] - cpu[i]));
      }
      const bool bf16 = b == gpu;
      std::printf(
          "%s (%s cache, %s activations): max |logit| %.3f, max CPU/CUDA difference %.3g "
          "(%.2g of the largest)\n",
          what.c_str(), std::string(KvCacheDTypeName(dtype)).c_str(), bf16 ? "bf16" : "f32", scale,
          err, err / scale);
      const float tolerance = bf16                           ? kBf16ActivationTolerance
                              : dtype == KvCacheDType::kBF16 ? bf16_tolerance
                                                             : 1e-3f;
      EXPECT_LE(err, tolerance * scale) << (bf16 ? "bf16" : "f32") << " activations";
    }
  }
}

#define KVSERVE_REQUIRE_CUDA_F32_ACTIVATIONS(var)              \
  std::string kvserve_f32_skip_reason;                         \
  Backend* var = CudaF32Activations(&kvserve_f32_skip_reason); \
  if (var == nullptr) KVSERVE_SKIP_NO_DEVICE(kvserve_f32_skip_reason)

TEST(CudaModelTest, MoeAndLatentAttentionModelsMatchTheCpu) {
  KVSERVE_REQUIRE_CUDA(gpu);
  KVSERVE_REQUIRE_CUDA_F32_ACTIVATIONS(gpu_f32);
  for (const std::string arch : {"mixtral", "qwen3_moe", "deepseek_v2", "deepseek_v3"}) {
    SCOPED_TRACE(arch);
    SynthWriteOptions o;
    o.model.architecture = arch;
    o.model.num_layers = 2;
    o.model.hidden_size = 64;
    o.model.num_heads = arch.starts_with("deepseek") ? 32 : 4;
    o.model.num_kv_heads = 2;
    o.model.intermediate_size = 96;
    o.model.num_experts = 8;
    o.model.num_experts_per_tok = 2;
    o.model.moe_intermediate_size = 32;
    // DeepSeek: 512 + 64 = 576-wide latent rows (the wide decode path) read by 32 query heads
    // (more than one thread block's shared memory holds at that width).
    o.model.kv_lora_rank = 512;
    o.model.qk_nope_head_dim = 16;
    o.model.qk_rope_head_dim = 64;
    o.model.v_head_dim = 16;
    o.model.q_lora_rank = arch == "deepseek_v3" ? 48 : 0;
    o.model.n_group = arch == "deepseek_v3" ? 4 : 1;
    o.model.topk_group = arch == "deepseek_v3" ? 2 : 1;
    o.model.vocab_size = 600;
    o.model.max_position_embeddings = 64;
    o.model.seed = 3;
    o.out_dir = test_util::ScratchPath(arch);
    o.format = SynthFormat::kHf;
    absl::StatusOr<SynthOutputs> out = WriteSynthModel(o);
    ASSERT_TRUE(out.ok()) << out.status();
    absl::StatusOr<LoadedModel> m = LoadModel(out->hf_dir);
    ASSERT_TRUE(m.ok()) << m.status();
    ExpectStepLogitsMatchTheCpu(gpu, gpu_f32, m->weights.get(), arch);
  }
}

// Dense models, whose q/k/v (with and without biases) and gate/up take one stacked GEMM each on
// CUDA; Qwen3's qk-norm keeps q, k and v apart. With head_dim 64 the bf16-cache prefill runs on
// the tensor-core kernel (Q and P rounded to bf16).
TEST(CudaModelTest, DenseModelsWithStackedProjectionsMatchTheCpu) {
  KVSERVE_REQUIRE_CUDA(gpu);
  KVSERVE_REQUIRE_CUDA_F32_ACTIVATIONS(gpu_f32);
  struct Dense {
    const char* arch;
    bool bias;
    int head_dim;
  };
  for (const Dense& d : {Dense{"llama", false, 16}, Dense{"llama", true, 16},
                         Dense{"qwen3", false, 16}, Dense{"llama", false, 64}}) {
    const std::string what = std::string(d.arch) + (d.bias ? " with q/k/v biases" : "") +
                             ", head_dim " + std::to_string(d.head_dim);
    const bool bias = d.bias;
    SCOPED_TRACE(what);
    SynthWriteOptions o;
    o.model.architecture = d.arch;
    o.model.num_layers = 2;
    o.model.hidden_size = 4 * d.head_dim;
    o.model.num_heads = 4;
    o.model.num_kv_heads = 2;
    o.model.head_dim = d.head_dim;
    o.model.intermediate_size = 96;
    o.model.vocab_size = 600;
    o.model.max_position_embeddings = 64;
    o.model.seed = 5;
    o.out_dir = test_util::ScratchPath(std::string(d.arch) + (d.bias ? "_bias_d" : "_d") +
                                       std::to_string(d.head_dim));
    o.format = SynthFormat::kHf;
    absl::StatusOr<SynthOutputs> out = WriteSynthModel(o);
    ASSERT_TRUE(out.ok()) << out.status();
    absl::StatusOr<LoadedModel> m = LoadModel(out->hf_dir);
    ASSERT_TRUE(m.ok()) << m.status();
    // Qwen2-style biases, added to the loaded weights (the synthesizer writes none).
    std::vector<std::vector<float>> biases;
    biases.reserve(3 * m->weights->layers.size());
    for (LayerWeights& l : m->weights->layers) {
      if (!bias) break;
      for (TensorView* t : {&l.bq, &l.bk, &l.bv}) {
        const int64_t n = (t == &l.bq ? o.model.num_heads : o.model.num_kv_heads) * d.head_dim;
        biases.push_back(testing_cuda::Random(n, 40 + static_cast<uint32_t>(biases.size())));
        *t = TensorView{"bias", DType::kF32, {n}, biases.back().data()};
      }
    }
    // The tensor-core prefill rounds Q and P to bf16 (2^-9 relative): measured 1.4e-3.
    ExpectStepLogitsMatchTheCpu(gpu, gpu_f32, m->weights.get(), what,
                                d.head_dim == 64 ? 4e-3f : 1e-3f);
  }
}

// With bf16 activations every Linear reads its x as the op before wrote it (the norms,
// SiLU·mul and attention write bf16) and cuBLAS writes its bf16 or f32 y itself; q/k/v biases
// go into the RoPE + KV write. So a forward pass queues no ConvertRows pass at all -- with bf16
// weights (one GEMM each) and q8_0 ones (the GEMV at decode, bf16 slabs at prefill), with and
// without biases -- while the f32 escape hatch converts x before every 16-bit GEMM. The logits
// still match the CPU's within bf16 rounding.
TEST(CudaModelTest, Bf16ActivationsRunNoConversionPerLinear) {
  KVSERVE_REQUIRE_CUDA(gpu);
  KVSERVE_REQUIRE_CUDA_F32_ACTIVATIONS(gpu_f32);
  ASSERT_GE(ActivationConversions(), 0) << "kvserve_cuda_activation_conversions is not exported";
  for (const auto& [dtype, bias] : {std::pair{DType::kBF16, false}, std::pair{DType::kBF16, true},
                                    std::pair{DType::kQ8_0, true}}) {
    const std::string what =
        std::string(DTypeName(dtype)) + " weights" + (bias ? ", q/k/v biases" : "");
    SCOPED_TRACE(what);
    SynthWriteOptions o;
    o.model.architecture = "llama";
    o.model.num_layers = 2;
    o.model.hidden_size = 64;
    o.model.num_heads = 4;
    o.model.num_kv_heads = 2;
    o.model.intermediate_size = 96;
    o.model.vocab_size = 600;
    o.model.max_position_embeddings = 64;
    o.model.dtype = dtype;
    o.model.seed = 9;
    o.out_dir = test_util::ScratchPath(std::string("conversions_") + std::string(DTypeName(dtype)));
    o.format = dtype == DType::kBF16 ? SynthFormat::kHf : SynthFormat::kGguf;
    absl::StatusOr<SynthOutputs> out = WriteSynthModel(o);
    ASSERT_TRUE(out.ok()) << out.status();
    absl::StatusOr<LoadedModel> m = LoadModel(dtype == DType::kBF16 ? out->hf_dir : out->gguf_path);
    ASSERT_TRUE(m.ok()) << m.status();
    std::vector<std::vector<float>> biases;
    biases.reserve(3 * m->weights->layers.size());
    for (LayerWeights& l : m->weights->layers) {
      if (!bias) break;
      for (TensorView* t : {&l.bq, &l.bk, &l.bv}) {
        const int64_t n = (t == &l.bq ? 4 : 2) * 16;
        biases.push_back(testing_cuda::Random(n, 60 + static_cast<uint32_t>(biases.size())));
        *t = TensorView{"bias", DType::kF32, {n}, biases.back().data()};
      }
    }
    const int64_t before = ActivationConversions();
    const std::vector<float> cuda = StepLogits(m->weights.get(), gpu, KvCacheDType::kBF16);
    EXPECT_EQ(ActivationConversions(), before) << "activation conversions in a bf16 forward pass";
    // The escape hatch converts x to bf16 before every 16-bit GEMM (7 steps x (2 layers x 4
    // Linears + the logits)) -- for q8_0, before each of the prefill's 8 slab GEMMs (the GEMV
    // reads f32 x): the counter counts.
    const int64_t f32_before = ActivationConversions();
    const std::vector<float> cuda_f32 = StepLogits(m->weights.get(), gpu_f32, KvCacheDType::kBF16);
    EXPECT_EQ(ActivationConversions() - f32_before, dtype == DType::kBF16 ? 7 * 9 : 8);
    const std::vector<float> cpu = StepLogits(m->weights.get(), nullptr, KvCacheDType::kBF16);
    ASSERT_EQ(cuda.size(), cpu.size());
    float scale = 1.0f, err = 0.0f;
    for (size_t i = 0; i < cpu.size(); ++i) {
      scale = std::max(scale, std::fabs(cpu[i]));
      err = std::max(err, std::fabs(cuda[i] - cpu[i]));
    }
    std::printf("%s: max |logit| %.3f, max CPU/CUDA (bf16 activations) difference %.3g\n",
                what.c_str(), scale, err);
    EXPECT_LE(err, kBf16ActivationTolerance * scale);
  }
}

TEST(CudaModelTest, GreedyTokensOnStories260KMatchTheCpu) {
  KVSERVE_REQUIRE_CUDA(gpu);
  absl::StatusOr<LoadedModel> m =
      LoadModel(KVSERVE_SHARED_DIR "/models/stories260K/stories260K.gguf");
  ASSERT_TRUE(m.ok()) << m.status();
  const std::vector<TokenId> cpu = Greedy(m->weights.get(), nullptr, 64);
  const std::vector<TokenId> cuda = Greedy(m->weights.get(), gpu, 64);
  ASSERT_EQ(cpu.size(), 64u);
  EXPECT_EQ(cuda, cpu);
}

// FP8 weights (BackendOptions::fp8_weights) through the whole model: stories260K's logits over a
// prefill and decode steps on CUDA against the CPU twin's (CpuBackend::set_fp8_weights: the same
// codes and scales, activations quantized by the same rule). With f32 activations they differ by
// f32 summation order, which can move an activation across an FP8 rounding boundary now and
// then (measured on the simulator: 5.5e-7 of the largest |logit|); with bf16 activations the
// rounding of every activation to bf16 moves many across (3.9e-2, about half the FP8 error
// itself). The FP8 error (the twin against the f32 model, 8.3e-2) is printed and must be there.
TEST(CudaModelTest, Fp8WeightsGiveTheCpuTwinsLogits) {
  absl::StatusOr<LoadedModel> m =
      LoadModel(KVSERVE_SHARED_DIR "/models/stories260K/stories260K.gguf");
  ASSERT_TRUE(m.ok()) << m.status();
  cpu::CpuBackend cpu_fp8(nullptr);
  cpu_fp8.set_fp8_weights(true);
  const std::vector<float> f32 = StepLogits(m->weights.get(), nullptr, KvCacheDType::kF32);
  const std::vector<float> twin = StepLogits(m->weights.get(), &cpu_fp8, KvCacheDType::kF32);
  auto compare = [](const std::vector<float>& a, const std::vector<float>& b) {
    float scale = 1.0f, err = 0.0f;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      scale = std::max(scale, std::fabs(a[i]));
      err = std::max(err, std::fabs(a[i] - b[i]));
    }
    return err / scale;
  };
  const float fp8_error = compare(f32, twin);
  std::printf("stories260K: FP8 weights (CPU twin) against f32: %.3g of the largest |logit|\n",
              fp8_error);
  EXPECT_GT(fp8_error, 0.0f);
  EXPECT_LT(fp8_error, 0.2f);
  for (bool f32_activations : {true, false}) {
    BackendOptions options = testing_cuda::DeviceOptions();
    options.fp8_weights = true;
    options.f32_activations = f32_activations;
    absl::StatusOr<std::unique_ptr<Backend>> gpu = LoadCudaBackend(options);
    if (!gpu.ok()) KVSERVE_SKIP_NO_DEVICE(gpu.status().message());
    const std::vector<float> cuda = StepLogits(m->weights.get(), gpu->get(), KvCacheDType::kF32);
    ASSERT_EQ(cuda.size(), twin.size());
    const float diff = compare(twin, cuda);
    std::printf("stories260K FP8 weights, %s activations: CUDA against the CPU twin %.3g\n",
                f32_activations ? "f32" : "bf16", diff);
    EXPECT_LE(diff, f32_activations ? 1e-3f : 8e-2f);
  }
}

TEST(CudaModelTest, DecodeStepsReplayedFromCudaGraphsGiveTheCpuTokens) {
  KVSERVE_REQUIRE_CUDA(gpu);
  ASSERT_TRUE(gpu->supports_graphs());
  absl::StatusOr<LoadedModel> m =
      LoadModel(KVSERVE_SHARED_DIR "/models/stories260K/stories260K.gguf");
  ASSERT_TRUE(m.ok()) << m.status();
  const std::vector<TokenId> cpu = Greedy(m->weights.get(), nullptr, 64);
  DecodeGraphStats stats;
  const std::vector<TokenId> cuda = Greedy(m->weights.get(), gpu, 64, &stats);
  EXPECT_EQ(cuda, cpu);
  EXPECT_EQ(stats.captures, 1);
  EXPECT_EQ(stats.replays, 63);  // 64 decode steps; the capturing one ran eagerly
}

// Eagerly and with decode graphs: each rank enqueues its NCCL all-reduce on its own stream (no
// host synchronisation inside a step), so its decode steps are captured with the collectives.
TEST(CudaModelTest, TensorParallelOverNcclGivesTheCpuTokens) {
  KVSERVE_REQUIRE_CUDA(gpu);
  absl::StatusOr<LoadedModel> m =
      LoadModel(KVSERVE_SHARED_DIR "/models/stories260K/stories260K.gguf");
  ASSERT_TRUE(m.ok()) << m.status();
  // stories260K has 4 kv heads: tp 2 splits them, tp 4 gives each rank one.
  const std::vector<TokenId> cpu = Greedy(m->weights.get(), nullptr, 64);
  KVSERVE_REQUIRE_DEVICES(2);
  for (const auto& [tp, graphs] : {std::pair{2, false}, std::pair{2, true}, std::pair{4, true}}) {
    if (tp > testing_cuda::UsableDevices()) {
      std::printf("tp %d left out: %d CUDA devices present\n", tp, testing_cuda::UsableDevices());
      continue;
    }
    TensorParallelOptions options;
    options.tp_size = tp;
    options.make_backend = [graphs](int rank) {
      BackendOptions o = testing_cuda::DeviceOptions(rank);
      o.enable_graphs = graphs;
      return LoadCudaBackend(o);
    };
    options.make_communicators = [](int n) {
      return CreateNcclGroup(n, testing_cuda::UseSimulator());
    };
    absl::StatusOr<std::unique_ptr<TensorParallelModel>> model =
        TensorParallelModel::Create(m->weights.get(), options);
    ASSERT_TRUE(model.ok()) << "tp " << tp << ": " << model.status();
    const int64_t blocks = m->config().max_position_embeddings / kBlockSize + 1;
    if (graphs) {
      DecodeGraphOptions g;
      g.max_batch = 4;
      g.max_context_len = m->config().max_position_embeddings;
      g.block_table_stride = blocks;
      const absl::Status s = (*model)->EnableDecodeGraphs(g);
      ASSERT_TRUE(s.ok()) << s;
    }
    auto cache = *(*model)->CreateKvCache(blocks, kBlockSize);
    std::vector<int32_t> table(blocks - 1);
    std::iota(table.begin(), table.end(), 1);
    BatchBuilder builder;
    std::vector<TokenId> tokens = {1, 403, 407};
    std::vector<float> logits(m->config().vocab_size);
    int32_t pos = 0;
    std::vector<TokenId> out;
    for (int i = 0; i < 64; ++i) {
      builder.Clear();
      std::span<const TokenId> feed(tokens.data() + pos, tokens.size() - pos);
      builder.AddSequence(feed, pos, table, kBlockSize, true);
      absl::Status s = (*model)->Forward(builder.Build(), *cache, logits.data());
      ASSERT_TRUE(s.ok()) << s;
      pos = static_cast<int32_t>(tokens.size());
      out.push_back(static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) -
                                         logits.begin()));
      tokens.push_back(out.back());
    }
    EXPECT_EQ(out, cpu) << "tp " << tp << (graphs ? " with graphs" : " eager");
    for (int r = 0; graphs && r < tp; ++r) {
      // 63 decode steps after the prompt: one captured (and run eagerly), 62 replayed.
      EXPECT_EQ((*model)->decode_graph_stats(r).captures, 1) << "rank " << r;
      EXPECT_EQ((*model)->decode_graph_stats(r).replays, 62) << "rank " << r;
    }
    EXPECT_EQ((*model)->decode_graph_error(), "");
  }
}

}  // namespace
}  // namespace kvserve
