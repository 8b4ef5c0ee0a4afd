// Every CUDA op except attention against its CPU twin (CpuBackend) at odd shapes, with per-op
// tolerances. Skips when there is no CUDA device.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/block_quant.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/kv_quant.h"
#include "kernels/cpu/paged_attention.h"
#include "tests/kernels/cuda/cuda_test_util.h"

namespace kvserve {
namespace {

using testing_cuda::Download;
using testing_cuda::MaxAbsDiff;
using testing_cuda::Random;
using testing_cuda::Upload;

// Rows of `cols` random weights stored as `dtype` (GGUF block layouts: random q8_0 / q4_0
// blocks; the other block formats through cpu::QuantizeRow).
std::vector<uint8_t> MakeWeights(DType dtype, int64_t rows, int64_t cols, uint32_t seed) {
  const std::vector<float> f = Random(rows * cols, seed);
  std::vector<uint8_t> out(DTypeRowBytes(dtype, cols) * rows);
  std::mt19937 rng(seed + 1);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = out.data() + r * DTypeRowBytes(dtype, cols);
    if (DTypeIsQuantized(dtype) && dtype != DType::kQ8_0 && dtype != DType::kQ4_0) {
      cpu::QuantizeRow(f.data() + r * cols, dtype, cols, row);
      continue;
    }
    for (int64_t c = 0; c < cols; ++c) {
      const float x = f[r * cols + c];
      switch (dtype) {
        case DType::kF32:
          std::memcpy(row + 4 * c, &x, 4);
          break;
        case DType::kF16: {
          const uint16_t h = FloatToHalf(x);
          std::memcpy(row + 2 * c, &h, 2);
          break;
        }
        case DType::kBF16: {
          const uint16_t h = FloatToBF16(x);
          std::memcpy(row + 2 * c, &h, 2);
          break;
        }
        case DType::kQ8_0:
        case DType::kQ4_0: {
          const bool q8 = dtype == DType::kQ8_0;
          uint8_t* block = row + (c / 32) * (q8 ? 34 : 18);
          if (c % 32 == 0) {
            const uint16_t d = FloatToHalf(q8 ? 0.01f : 0.1f);
            std::memcpy(block, &d, 2);
          }
          const int j = static_cast<int>(c % 32);
          if (q8) {
            block[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(rng() % 255 - 127));
          } else {
            const uint8_t nib = static_cast<uint8_t>(rng() % 16);
            block[2 + (j & 15)] =
                static_cast<uint8_t>(j < 16 ? (block[2 + (j & 15)] & 0xf0) | nib
                                            : (block[2 + (j & 15)] & 0x0f) | (nib << 4));
          }
          break;
        }
        case DType::kQ4_1:
        case DType::kQ5_0:
        case DType::kQ5_1:
        case DType::kQ4_K:
        case DType::kQ5_K:
        case DType::kQ6_K:
        case DType::kF8E4M3:  // not a stored weight type
          break;  // quantized per row above
      }
    }
  }
  return out;
}

constexpr DType kWeightTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0,
                                  DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                                  DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

// Row lengths of whole blocks: 32-element blocks as before, K-quants in 256-element ones.
int64_t Whole(DType dtype, int64_t n) {
  const int64_t b = DTypeBlockElems(dtype);
  return b > 32 ? (n + b - 1) / b * b : n;
}

TEST(CudaOpsTest, EmbeddingEveryWeightDType) {
  KVSERVE_REQUIRE_CUDA(gpu);
  cpu::CpuBackend cpu(nullptr);
  for (DType dtype : kWeightTypes) {
    for (int64_t dim_in : {64, 160, 512}) {
      const int64_t dim = Whole(dtype, dim_in);
      const int64_t vocab = 37;
      const std::vector<uint8_t> table = MakeWeights(dtype, vocab, dim, 7);
      const std::vector<int32_t> ids = {0, 36, 5, 5, 17, 1, 30};
      const int64_t n = static_cast<int64_t>(ids.size());
      std::vector<float> want(n * dim);
      cpu.Embedding({table.data(), dtype, dim, ids.data(), n, want.data()});
      DeviceBuffer d_table = Upload(gpu, table);
      DeviceBuffer d_ids = Upload(gpu, ids);
      absl::StatusOr<DeviceBuffer> d_out = gpu->AllocBuffer(sizeof(float) * n * dim);
      ASSERT_TRUE(d_out.ok());
      gpu->Embedding({d_table.get(), dtype, dim, d_ids.as<int32_t>(), n, d_out->as<float>()});
      EXPECT_EQ(Download<float>(gpu, d_out->get(), n * dim), want) << DTypeName(dtype);
    }
  }
}

TEST(CudaOpsTest, RmsNormWithAndWithoutResidual) {
  KVSERVE_REQUIRE_CUDA(gpu);
  cpu::CpuBackend cpu(nullptr);
  for (int64_t rows : {1, 3, 17}) {
    for (int64_t dim : {64, 130, 4096}) {
      for (bool residual : {false, true}) {
        std::vector<float> x = Random(rows * dim, 1);
        const std::vector<float> res = Random(rows * dim, 2);
        const std::vector<float> w = Random(dim, 3, 0.5f, 1.5f);
        DeviceBuffer dx = Upload(gpu, x);
        DeviceBuffer dres = Upload(gpu, res);
        DeviceBuffer dw = Upload(gpu, w);
        DeviceBuffer dy = Upload(gpu, std::vector<float>(rows * dim));
        std::vector<float> y(rows * dim);
        cpu::RmsNormArgs a{
            x.data(), residual ? res.data() : nullptr, w.data(), y.data(), rows, dim, 1e-5f, dim,
            dim};
        cpu.RmsNorm(a);
        cpu::RmsNormArgs g{dx.as<float>(),
                           residual ? dres.as<float>() : nullptr,
                           dw.as<float>(),
                           dy.as<float>(),
                           rows,
                           dim,
                           1e-5f,
                           dim,
                           dim};
        gpu->RmsNorm(g);
        EXPECT_LT(MaxAbsDiff(Download<float>(gpu, dy.get(), rows * dim), y), 1e-5f);
        EXPECT_LT(MaxAbsDiff(Download<float>(gpu, dx.get(), rows * dim), x), 1e-6f);
      }
    }
  }
}

// Rows of 1031 take the element-by-element kernel (not 16-byte aligned); 1024 (stride 1024) and
// 1030 (stride 1032: a tail of two past the last whole vector) the vector one.
TEST(CudaOpsTest, SiluMul) {
  KVSERVE_REQUIRE_CUDA(gpu);
  cpu::CpuBackend cpu(nullptr);
  struct Shape {
    int64_t rows, dim, stride;
  };
  for (const Shape& s : {Shape{1, 1031, 1031}, Shape{3, 1031, 1031}, Shape{17, 1031, 1031},
                         Shape{3, 1024, 1024}, Shape{5, 1030, 1032}}) {
    const int64_t n = s.rows * s.stride;
    const std::vector<float> gate = Random(n, 4, -6.0f, 6.0f);
    const std::vector<float> up = Random(n, 5);
    std::vector<float> out = gate;  // in place, as on the device: padding stays as it was
    cpu.SiluMul({gate.data(), up.data(), out.data(), s.rows, s.dim, s.stride, s.stride, s.stride});
    DeviceBuffer dg = Upload(gpu, gate);
    DeviceBuffer du = Upload(gpu, up);
    gpu->SiluMul({dg.as<float>(), du.as<float>(), dg.as<float>(), s.rows, s.dim, s.stride, s.stride,
                  s.stride});
    EXPECT_LT(MaxAbsDiff(Download<float>(gpu, dg.get(), n), out), 1e-5f)
        << s.rows << " x " << s.dim << " (stride " << s.stride << ")";
  }
}

TEST(CudaOpsTest, MatmulEveryWeightDType) {
  KVSERVE_REQUIRE_CUDA(gpu);
  cpu::CpuBackend cpu(nullptr);
  for (DType dtype : kWeightTypes) {
    for (int64_t m : {1, 3, 17}) {
      const int64_t n = 67;
      // m = 3 takes several K-quant super-blocks a row (768 elements: 24 GEMV lanes).
      const int64_t k = Whole(dtype, m == 3 ? 704 : 96);
      const std::vector<uint8_t> w = MakeWeights(dtype, n, k, 11);
      const std::vector<float> x = Random(m * k, 12);
      const std::vector<float> bias = Random(n, 13);
      std::vector<float> want(m * n);
      cpu.Matmul({x.data(), k, w.data(), dtype, bias.data(), want.data(), n, m, n, k});
      absl::StatusOr<PreparedMatrix> pw =
          gpu->PrepareMatrix(w.data(), dtype, n, k, MatrixUse::kMatmul);
      ASSERT_TRUE(pw.ok()) << pw.status();
      // Quantized weights stay packed on the device: no bf16 copy of 2-3.5x the bytes.
      if (DTypeIsQuantized(dtype)) {
        EXPECT_EQ(pw->dtype, dtype) << DTypeName(dtype);
      }
      DeviceBuffer dx = Upload(gpu, x);
      DeviceBuffer db = Upload(gpu, bias);
      DeviceBuffer dy = Upload(gpu, std::vector<float>(m * n));
      gpu->Matmul(
          {dx.as<float>(), k, pw->data, pw->dtype, db.as<float>(), dy.as<float>(), n, m, n, k});
      const std::vector<float> got = Download<float>(gpu, dy.get(), m * n);
      float scale = 0.0f;
      for (float v : want) scale = std::max(scale, std::abs(v));
      // f32 weights stay f32 here (keep_f32_weights); quantized ones at m <= 8 take the GEMV
      // (f32 x, exact weights; the CPU rounds x to 8 bits for its int8 dot products); the rest run
      // as 16-bit with x rounded.
      const bool gemv = DTypeIsQuantized(dtype) && m <= 8;
      const float tol = dtype == DType::kF32 ? 1e-5f
                        : gemv               ? 1e-2f
                                             : (dtype == DType::kF16 ? 2e-3f : 1.5e-2f);
      EXPECT_LT(MaxAbsDiff(got, want), tol * scale) << DTypeName(dtype) << " m=" << m;
    }
  }
}

// Quantized weights met by more than 8 x rows are dequantized to bf16 a slab of rows at a time
// (8 MiB): 1100 rows of 4096 take two slabs, the second a partial one.
TEST(CudaOpsTest, QuantizedMatmulOverSeveralSlabs) {
  KVSERVE_REQUIRE_CUDA(gpu);
  cpu::CpuBackend cpu(nullptr);
  const int64_t m = 9, n = 1100, k = 4096;
  const std::vector<uint8_t> w = MakeWeights(DType::kQ8_0, n, k, 21);
  const std::vector<float> x = Random(m * k, 22);
  std::vector<float> want(m * n);
  cpu.Matmul({x.data(), k, w.data(), DType::kQ8_0, nullptr, want.data(), n, m, n, k});
  absl::StatusOr<PreparedMatrix> pw =
      gpu->PrepareMatrix(w.data(), DType::kQ8_0, n, k, MatrixUse::kMatmul);
  ASSERT_TRUE(pw.ok()) << pw.status();
  DeviceBuffer dx = Upload(gpu, x);
  DeviceBuffer dy = Upload(gpu, std::vector<float>(m * n));
  gpu->Matmul({dx.as<float>(), k, pw->data, pw->dtype, nullptr, dy.as<float>(), n, m, n, k});
  float scale = 0.0f;
  for (float v : want) scale = std::max(scale, std::abs(v));
  EXPECT_LT(MaxAbsDiff(Download<float>(gpu, dy.get(), m * n), want), 1.5e-2f * scale);
}

// SampleTopKTopP on `b` with one parameter set for every row: row r samples logits row r with
// uniforms[r]. `logits` is `b`'s memory; returns the picks.
std::vector<int32_t> SampleRows(Backend* b, const float* logits, int64_t rows, int64_t vocab,
                                SampleRowParams p, const std::vector<double>& uniforms) {
  std::vector<SampleRowParams> params(rows, p);
  for (int64_t r = 0; r < rows; ++r) {
    params[r].row = r;
    params[r].uniform = uniforms[r];
  }
  DeviceBuffer dp = Upload(b, params);
  DeviceBuffer dout = Upload(b, std::vector<int32_t>(rows));
  b->SampleTopKTopP({logits, vocab, vocab, dp.as<SampleRowParams>(), rows, dout.as<int32_t>()});
  return Download<int32_t>(b, dout.get(), rows);
}

TEST(CudaOpsTest, ArgMaxAndTopKTopPSampling) {
  KVSERVE_REQUIRE_CUDA(gpu);
  cpu::CpuBackend cpu(nullptr);
  const int64_t rows = 17;
  const int64_t vocab = 32003;
  std::vector<float> logits = Random(rows * vocab, 21, -10.0f, 10.0f);
  logits[5 * vocab + 100] = 50.0f;  // a tie: the lower index wins
  logits[5 * vocab + 200] = 50.0f;
  const std::vector<float> draws = Random(rows, 22, 0.0f, 1.0f);
  const std::vector<double> uniforms(draws.begin(), draws.end());
  DeviceBuffer dl = Upload(gpu, logits);
  DeviceBuffer dout = Upload(gpu, std::vector<int32_t>(rows));
  std::vector<int32_t> want(rows);
  cpu.ArgMax(logits.data(), rows, vocab, vocab, want.data());
  gpu->ArgMax(dl.as<float>(), rows, vocab, vocab, dout.as<int32_t>());
  EXPECT_EQ(Download<int32_t>(gpu, dout.get(), rows), want);
  EXPECT_EQ(want[5], 100);
  for (int32_t k : {1, 7, 64}) {
    for (float top_p : {0.3f, 0.9f, 1.0f}) {
      const SampleRowParams p{.temperature = 2.0f, .top_p = top_p, .top_k = k};
      EXPECT_EQ(SampleRows(gpu, dl.as<float>(), rows, vocab, p, uniforms),
                SampleRows(&cpu, logits.data(), rows, vocab, p, uniforms))
          << "k=" << k << " p=" << top_p;
    }
  }
}

// Samples `logits` ([rows, vocab]) on the device and with the CPU twin for several k; the picks
// must be identical. The uniforms climb through [0, 1) over the rows, so rows that repeat one
// pattern, with a temperature that flattens the softmax and no nucleus cut, reach every rank of
// the top k: a wrong order among the k best shows as a different pick.
void ExpectSamplingLikeCpu(Backend* gpu, const std::vector<float>& logits, int64_t rows,
                           int64_t vocab, const char* what) {
  cpu::CpuBackend cpu(nullptr);
  std::vector<double> uniforms(rows);
  for (int64_t r = 0; r < rows; ++r) uniforms[r] = (static_cast<double>(r) + 0.5) / rows;
  DeviceBuffer dl = Upload(gpu, logits);
  for (int32_t k : {1, 7, 64}) {
    for (const auto& [top_p, temperature] :
         {std::pair{1.0f, 1e4f}, std::pair{0.5f, 1.0f}, std::pair{0.9f, 0.7f}}) {
      const SampleRowParams p{.temperature = temperature, .top_p = top_p, .top_k = k};
      EXPECT_EQ(SampleRows(gpu, dl.as<float>(), rows, vocab, p, uniforms),
                SampleRows(&cpu, logits.data(), rows, vocab, p, uniforms))
          << what << ": k=" << k << " p=" << top_p << " t=" << temperature;
    }
  }
}

// `pattern` repeated over `rows` rows.
std::vector<float> RepeatRows(const std::vector<float>& pattern, int64_t rows) {
  std::vector<float> out;
  out.reserve(pattern.size() * rows);
  for (int64_t r = 0; r < rows; ++r) out.insert(out.end(), pattern.begin(), pattern.end());
  return out;
}

TEST(CudaOpsTest, TopKTopPSamplingLargeVocabulary) {
  KVSERVE_REQUIRE_CUDA(gpu);
  // 128256 logits uniform in [-10, 10): the k-th best's first-digit bin ([9, 10), ~6400 logits)
  // overflows the gather buffer, so the second digit runs. Normal logits (like a model's) leave
  // it small: histogram and gather only.
  const int64_t vocab = 128256;
  std::vector<float> logits = Random(3 * vocab, 41, -10.0f, 10.0f);
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t i = 0; i < vocab; ++i) logits.push_back(normal(rng));
  }
  ExpectSamplingLikeCpu(gpu, logits, 6, vocab, "uniform and normal logits");
  // One row of each kind, repeated, so that the picks cover every rank of the top k.
  std::vector<float> pattern(logits.begin(), logits.begin() + vocab);
  ExpectSamplingLikeCpu(gpu, RepeatRows(pattern, 16), 16, vocab, "uniform, repeated");
  pattern.assign(logits.begin() + 3 * vocab, logits.begin() + 4 * vocab);
  ExpectSamplingLikeCpu(gpu, RepeatRows(pattern, 16), 16, vocab, "normal, repeated");
}

TEST(CudaOpsTest, TopKTopPSamplingTies) {
  KVSERVE_REQUIRE_CUDA(gpu);
  // Logits rounded to a few values: the boundary is a crowd of exact ties, ranked by index.
  // 5 values over 3000 logits: ~400 ties at the top, gathered and sorted; 3 values over 60000:
  // ~20000 ties, more than the buffer holds at every digit, so the ordered tie pass runs.
  for (const auto& [vocab, levels] : {std::pair<int64_t, float>{3000, 2.0f}, {60000, 1.5f}}) {
    std::vector<float> pattern = Random(vocab, 51, -levels, levels);
    for (float& x : pattern) x = std::round(x);
    ExpectSamplingLikeCpu(gpu, RepeatRows(pattern, 32), 32, vocab, "quantized logits");
  }
  // Near ties: 1 + m ulps (m in 1..255) share the first two key digits, so the third (the
  // lowest 8 bits) places the boundary; ~20 logits share each value.
  std::vector<float> ulps(5000);
  std::mt19937 rng(52);
  for (float& x : ulps) x = 1.0f + static_cast<float>(1 + rng() % 255) * 0x1p-23f;
  ExpectSamplingLikeCpu(gpu, RepeatRows(ulps, 32), 32, 5000, "values ulps apart");
  // Distinct logits that the temperature step's logit - max (the max is 8) rounds onto a few
  // values: those ties rank by index, as in the host sampler, not by the raw logits.
  std::vector<float> collapse(5000);
  for (float& x : collapse) x = 0.1f + static_cast<float>(rng() % 4096) * 0x1p-27f;
  collapse[17] = 8.0f;
  ExpectSamplingLikeCpu(gpu, RepeatRows(collapse, 32), 32, 5000, "ties made by the temperature");
  // All equal: the top k are the first k indices.
  for (int64_t vocab : {int64_t{100}, int64_t{5000}, int64_t{70000}}) {
    ExpectSamplingLikeCpu(gpu, std::vector<float>(32 * vocab, 1.25f), 32, vocab, "all equal");
  }
}

TEST(CudaOpsTest, TopKTopPSamplingMaskedAndNaN) {
  KVSERVE_REQUIRE_CUDA(gpu);
  for (int64_t vocab : {int64_t{1000}, int64_t{40000}}) {
    // Masked to -inf but for 10 scattered logits (fewer than k): the rest of the top k are the
    // lowest-index -inf entries.
    std::vector<float> masked(vocab, -INFINITY);
    for (int64_t j = 0; j < 10; ++j) masked[(j * 7919 + 13) % vocab] = static_cast<float>(j % 4);
    ExpectSamplingLikeCpu(gpu, RepeatRows(masked, 24), 24, vocab, "masked to -inf");
    // Everything -inf: a NaN softmax, which the CPU and the device walk the same way.
    ExpectSamplingLikeCpu(gpu, std::vector<float>(4 * vocab, -INFINITY), 4, vocab, "all -inf");
    // NaNs rank last: scattered ones among random logits, and a row of NaNs with 5 numbers.
    std::vector<float> nans = Random(vocab, 61, -5.0f, 5.0f);
    for (int64_t i = 3; i < vocab; i += 17) nans[i] = std::nanf("");
    std::vector<float> mostly_nan(vocab, std::nanf(""));
    for (int64_t j = 0; j < 5; ++j) mostly_nan[(j * 104729 + 5) % vocab] = -static_cast<float>(j);
    std::vector<float> logits = RepeatRows(nans, 8);
    const std::vector<float> more = RepeatRows(mostly_nan, 8);
    logits.insert(logits.end(), more.begin(), more.end());
    ExpectSamplingLikeCpu(gpu, logits, 16, vocab, "NaN");
  }
}

TEST(CudaOpsTest, TopKTopPSamplingSignedZeros) {
  KVSERVE_REQUIRE_CUDA(gpu);
  // -0.0 == +0.0 for the ranking, so the k-th place falls in a run of zeros of both signs that
  // must be taken by index alone, sign ignored. 20 positives rank first; 1500 zeros fit the
  // gather buffer, 5000 do not.
  for (int64_t zeros : {int64_t{1500}, int64_t{5000}}) {
    const int64_t vocab = zeros + 3000;
    std::vector<float> pattern = Random(vocab, 71, -3.0f, -0.5f);
    std::mt19937 rng(72);
    for (int64_t j = 0; j < zeros; ++j) {
      pattern[(j * 7 + rng() % 7) % vocab] = rng() % 2 == 0 ? 0.0f : -0.0f;
    }
    for (int64_t j = 0; j < 20; ++j) pattern[(j * 389 + 11) % vocab] = 0.25f * (j % 3 + 1);
    ExpectSamplingLikeCpu(gpu, RepeatRows(pattern, 32), 32, vocab, "signed zeros");
  }
}

TEST(CudaOpsTest, TopKTopPSamplingTinyVocabulary) {
  KVSERVE_REQUIRE_CUDA(gpu);
  // k is cut to the vocabulary: all five logits (two tied) are the candidates.
  const std::vector<float> pattern = {0.5f, -1.0f, 2.0f, 0.5f, -3.0f};
  ExpectSamplingLikeCpu(gpu, RepeatRows(pattern, 12), 12, 5, "vocab 5");
  ExpectSamplingLikeCpu(gpu, std::vector<float>(3, 7.0f), 3, 1, "vocab 1");
}

TEST(CudaOpsTest, RopeKvWriteEveryKvDType) {
  KVSERVE_REQUIRE_CUDA(gpu);
  cpu::CpuBackend cpu(nullptr);
  for (KvCacheDType dtype : kAllKvCacheDTypes) {
    for (int64_t head_dim : {64, 128}) {
      for (cpu::RopeLayout rl : {cpu::RopeLayout::kInterleaved, cpu::RopeLayout::kHalfSplit}) {
        const int64_t t = 17, heads = 8, kv_heads = 2, block_size = 16, num_blocks = 4;
        const int64_t q_dim = heads * head_dim, kv_dim = kv_heads * head_dim;
        std::vector<float> q = Random(t * q_dim, 31), k = Random(t * kv_dim, 32);
        const std::vector<float> v = Random(t * kv_dim, 33);
        std::vector<int32_t> pos(t);
        std::vector<int64_t> slots(t);
        for (int64_t i = 0; i < t; ++i) {
          pos[i] = static_cast<int32_t>(i * 61 % 997);
          slots[i] = i == 3 ? -1 : (i * 5) % (num_blocks * block_size);  // one padding token
        }
        std::vector<float> inv(head_dim / 2);
        for (int64_t i = 0; i < head_dim / 2; ++i)
          inv[i] = std::pow(10000.0f, -2.0f * i / head_dim);
        const cpu::PagedKvLayout layout{kv_heads, head_dim, block_size, dtype};
        const int64_t rows = num_blocks * kv_heads * block_size;
        const int64_t bytes = rows * head_dim * KvCacheDTypeElemBytes(dtype);
        std::vector<uint8_t> kc(bytes), vc(bytes);
        std::vector<float> ks(rows), vs(rows);
        DeviceBuffer dq = Upload(gpu, q), dk = Upload(gpu, k), dv = Upload(gpu, v);
        DeviceBuffer dpos = Upload(gpu, pos), dslots = Upload(gpu, slots), dinv = Upload(gpu, inv);
        DeviceBuffer dkc = Upload(gpu, kc), dvc = Upload(gpu, vc);
        DeviceBuffer dks = Upload(gpu, ks), dvs = Upload(gpu, vs);
        RopeKvWriteArgs a{q.data(),
                          k.data(),
                          v.data(),
                          t,
                          heads,
                          q_dim,
                          kv_dim,
                          kv_dim,
                          pos.data(),
                          inv.data(),
                          rl,
                          slots.data(),
                          layout,
                          {kc.data(), ks.data()},
                          {vc.data(), vs.data()}};
        cpu.RopeKvWrite(a);
        RopeKvWriteArgs g{dq.as<float>(),
                          dk.as<float>(),
                          dv.as<float>(),
                          t,
                          heads,
                          q_dim,
                          kv_dim,
                          kv_dim,
                          dpos.as<int32_t>(),
                          dinv.as<float>(),
                          rl,
                          dslots.as<int64_t>(),
                          layout,
                          {dkc.get(), dks.as<float>()},
                          {dvc.get(), dvs.as<float>()}};
        gpu->RopeKvWrite(g);
        EXPECT_LT(MaxAbsDiff(Download<float>(gpu, dq.get(), q.size()), q), 2e-5f);
        EXPECT_LT(MaxAbsDiff(Download<float>(gpu, dk.get(), k.size()), k), 2e-5f);
        // Decoded cache rows agree within about one step of the dtype's grid.
        const float tol = dtype == KvCacheDType::kF32    ? 2e-5f
                          : dtype == KvCacheDType::kF16  ? 2e-3f
                          : dtype == KvCacheDType::kBF16 ? 1e-2f
                          : dtype == KvCacheDType::kInt8 ? 2e-2f
                                                         : 0.15f;
        const std::vector<uint8_t> gk = Download<uint8_t>(gpu, dkc.get(), bytes);
        const std::vector<float> gks = Download<float>(gpu, dks.get(), rows);
        const std::vector<uint8_t> gv = Download<uint8_t>(gpu, dvc.get(), bytes);
        const std::vector<float> gvs = Download<float>(gpu, dvs.get(), rows);
        const int64_t eb = KvCacheDTypeElemBytes(dtype);
        std::vector<float> a_row(head_dim), b_row(head_dim);
        float worst = 0.0f;
        for (int64_t r = 0; r < rows; ++r) {
          cpu::DecodeKvVector(dtype, kc.data() + r * head_dim * eb, ks[r], head_dim, a_row.data());
          cpu::DecodeKvVector(dtype, gk.data() + r * head_dim * eb, gks[r], head_dim, b_row.data());
          worst = std::max(worst, MaxAbsDiff(a_row, b_row));
          cpu::DecodeKvVector(dtype, vc.data() + r * head_dim * eb, vs[r], head_dim, a_row.data());
          cpu::DecodeKvVector(dtype, gv.data() + r * head_dim * eb, gvs[r], head_dim, b_row.data());
          worst = std::max(worst, MaxAbsDiff(a_row, b_row));
        }
        EXPECT_LT(worst, tol) << KvCacheDTypeName(dtype) << " d=" << head_dim;
      }
    }
  }
}

// Multi-head latent attention's write: one 576-wide latent row per token (no V), RoPE on the
// last 64 values of every query head and of the row only.
TEST(CudaOpsTest, RopeKvWriteLatentRowsRotateOnlyTheRopePart) {
  KVSERVE_REQUIRE_CUDA(gpu);
  cpu::CpuBackend cpu(nullptr);
  for (KvCacheDType dtype : {KvCacheDType::kBF16, KvCacheDType::kInt8}) {
    const int64_t t = 9, heads = 4, row = 576, rotary = 64, block_size = 16, num_blocks = 2;
    std::vector<float> q = Random(t * heads * row, 41), k = Random(t * row, 42);
    std::vector<int32_t> pos(t);
    std::vector<int64_t> slots(t);
    for (int64_t i = 0; i < t; ++i) {
      pos[i] = static_cast<int32_t>(i * 37 % 500);
      slots[i] = (i * 3) % (num_blocks * block_size);
    }
    std::vector<float> inv(rotary / 2);
    for (int64_t i = 0; i < rotary / 2; ++i) inv[i] = std::pow(10000.0f, -2.0f * i / rotary);
    const cpu::PagedKvLayout layout{1, row, block_size, dtype};
    const int64_t rows = num_blocks * block_size;
    const int64_t bytes = rows * row * KvCacheDTypeElemBytes(dtype);
    std::vector<uint8_t> kc(bytes);
    std::vector<float> ks(rows);
    DeviceBuffer dq = Upload(gpu, q), dk = Upload(gpu, k), dpos = Upload(gpu, pos);
    DeviceBuffer dslots = Upload(gpu, slots), dinv = Upload(gpu, inv);
    DeviceBuffer dkc = Upload(gpu, kc), dks = Upload(gpu, ks);
    const std::vector<float> q0 = q;
    RopeKvWriteArgs a{};
    a.q = q.data();
    a.k = k.data();
    a.num_tokens = t;
    a.num_heads = heads;
    a.q_stride = heads * row;
    a.k_stride = row;
    a.positions = pos.data();
    a.inv_freq = inv.data();
    a.rope_layout = cpu::RopeLayout::kInterleaved;
    a.slot_mapping = slots.data();
    a.layout = layout;
    a.k_cache = {kc.data(), ks.data()};
    a.rotary_dim = rotary;
    cpu.RopeKvWrite(a);
    RopeKvWriteArgs g = a;
    g.q = dq.as<float>();
    g.k = dk.as<float>();
    g.positions = dpos.as<int32_t>();
    g.inv_freq = dinv.as<float>();
    g.slot_mapping = dslots.as<int64_t>();
    g.k_cache = {dkc.get(), dks.as<float>()};
    gpu->RopeKvWrite(g);
    const std::vector<float> gq = Download<float>(gpu, dq.get(), q.size());
    EXPECT_LT(MaxAbsDiff(gq, q), 2e-5f);
    EXPECT_LT(MaxAbsDiff(Download<float>(gpu, dk.get(), k.size()), k), 2e-5f);
    // The latent part of every query head is untouched.
    for (int64_t i = 0; i < t * heads; ++i) {
      for (int64_t d = 0; d < row - rotary; ++d) ASSERT_EQ(gq[i * row + d], q0[i * row + d]);
    }
    const std::vector<uint8_t> gk = Download<uint8_t>(gpu, dkc.get(), bytes);
    const std::vector<float> gks = Download<float>(gpu, dks.get(), rows);
    const int64_t eb = KvCacheDTypeElemBytes(dtype);
    std::vector<float> a_row(row), b_row(row);
    float worst = 0.0f;
    for (int64_t r = 0; r < rows; ++r) {
      cpu::DecodeKvVector(dtype, kc.data() + r * row * eb, ks[r], row, a_row.data());
      cpu::DecodeKvVector(dtype, gk.data() + r * row * eb, gks[r], row, b_row.data());
      worst = std::max(worst, MaxAbsDiff(a_row, b_row));
    }
    EXPECT_LT(worst, dtype == KvCacheDType::kBF16 ? 1e-2f : 2e-2f) << KvCacheDTypeName(dtype);
  }
}

}  // namespace
}  // namespace kvserve

namespace kvserve {
namespace {

// Errors are reported once: a refused launch fails the next Synchronize only, and a capture
// that fails (here: the matmul scratch would have to grow, which CUDA forbids while capturing)
// reports why and leaves the backend working eagerly, as the model's fallback needs.
TEST(CudaOpsTest, ErrorsAreReportedOnceAndAFailedCaptureLeavesTheBackendUsable) {
  KVSERVE_REQUIRE_CUDA(shared_gpu);
  BackendOptions options = testing_cuda::DeviceOptions();
  options.enable_graphs = true;
  absl::StatusOr<std::unique_ptr<Backend>> b = LoadCudaBackend(options);
  ASSERT_TRUE(b.ok()) << b.status();
  Backend* gpu = b->get();

  // head_dim 1024 (wider than MLA's 576-value rows) is refused by the decode kernel (no
  // launch): one error, then none.
  cpu::PagedAttentionArgs bad{};
  bad.num_seqs = 1;
  bad.num_heads = 1;
  bad.layout = {1, 1024, 16, KvCacheDType::kF32};
  AttentionShape shape;
  shape.num_seqs = 1;
  shape.num_heads = 1;
  shape.max_q_len = 1;
  shape.max_context_len = 16;
  shape.layout = bad.layout;
  gpu->RunAttention(gpu->PlanAttention(shape), bad);
  EXPECT_FALSE(gpu->Synchronize().ok());
  EXPECT_TRUE(gpu->Synchronize().ok());

  const int64_t m = 8, n = 32, k = 256;
  std::vector<uint16_t> w(n * k);
  for (size_t i = 0; i < w.size(); ++i) w[i] = FloatToBF16(static_cast<float>(i % 7) * 0.25f);
  absl::StatusOr<PreparedMatrix> pw =
      gpu->PrepareMatrix(w.data(), DType::kBF16, n, k, MatrixUse::kMatmul);
  ASSERT_TRUE(pw.ok()) << pw.status();
  DeviceBuffer dx = testing_cuda::Upload(gpu, std::vector<float>(m * k, 1.0f));
  DeviceBuffer dy = testing_cuda::Upload(gpu, std::vector<float>(m * n));
  const cpu::MatmulArgs args{dx.as<float>(), k, pw->data, pw->dtype, nullptr,
                             dy.as<float>(), n, m,        n,         k};
  ASSERT_TRUE(gpu->BeginCapture().ok());
  gpu->Matmul(args);  // first matmul: its scratch does not exist yet
  absl::StatusOr<int> graph = gpu->EndCapture();
  ASSERT_FALSE(graph.ok());
  EXPECT_NE(graph.status().message().find("cannot allocate during a CUDA graph capture"),
            std::string::npos)
      << graph.status();
  // Eagerly, the same op works and nothing of the failed capture is left over.
  gpu->Matmul(args);
  ASSERT_TRUE(gpu->Synchronize().ok());
  const std::vector<float> y = Download<float>(gpu, dy.get(), m * n);
  float want = 0;
  for (int64_t c = 0; c < k; ++c) want += BF16ToFloat(w[c]);
  EXPECT_NEAR(y[0], want, 1e-3f * std::abs(want));
  // And a capture after the warm-up succeeds.
  ASSERT_TRUE(gpu->BeginCapture().ok());
  gpu->Matmul(args);
  graph = gpu->EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_TRUE(gpu->LaunchGraph(*graph).ok());
  EXPECT_TRUE(gpu->Synchronize().ok());
}

}  // namespace
}  // namespace kvserve
