// The CUDA ops with bf16 activations (Backend::activation_dtype, docs/gpu.md "Activations in
// bf16") against their CPU twins in f32 on the same bf16-rounded inputs: the differences are the
// one rounding of each bf16 output (at most 2^-9 relative) plus the f32 twins' own tolerances.
// Also that the model's usual Linear shapes queue no ConvertRows pass. Skips without a CUDA
// device.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
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

// One bf16 rounding, relative to the largest magnitude: 2^-9, with room for the f32 sums before.
constexpr float kBf16Rounding = 1.0f / 256.0f;

std::vector<uint16_t> ToBf16(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = FloatToBF16(x[i]);
  return out;
}

std::vector<float> FromBf16(const std::vector<uint16_t>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = BF16ToFloat(x[i]);
  return out;
}

// x rounded to bf16 and back: what the CPU reference reads.
std::vector<float> Rounded(const std::vector<float>& x) { return FromBf16(ToBf16(x)); }

float MaxAbs(const std::vector<float>& x) {
  float m = 0.0f;
  for (float v : x) m = std::max(m, std::fabs(v));
  return m;
}

// Activation conversion / bias passes the CUDA library has queued so far (-1 if not exported).
int64_t ActivationConversions() {
  absl::StatusOr<void*> fn =
      CudaLibrarySymbol("kvserve_cuda_activation_conversions", testing_cuda::UseSimulator());
  if (!fn.ok()) return -1;
  return reinterpret_cast<long long (*)()>(*fn)();
}

// `rows` rows of `cols` random weights stored as `dtype`.
std::vector<uint8_t> MakeWeights(DType dtype, int64_t rows, int64_t cols, uint32_t seed) {
  const std::vector<float> f = Random(rows * cols, seed);
  std::vector<uint8_t> out(DTypeRowBytes(dtype, cols) * rows);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = out.data() + r * DTypeRowBytes(dtype, cols);
    const float* src = f.data() + r * cols;
    if (DTypeIsQuantized(dtype)) {
      cpu::QuantizeRow(src, dtype, cols, row);
      continue;
    }
    for (int64_t c = 0; c < cols; ++c) {
      if (dtype == DType::kF32) {
        std::memcpy(row + 4 * c, src + c, 4);
      } else {
        const uint16_t h = dtype == DType::kF16 ? FloatToHalf(src[c]) : FloatToBF16(src[c]);
        std::memcpy(row + 2 * c, &h, 2);
      }
    }
  }
  return out;
}

// Every weight path of cuda::Matmul with bf16 x: cuBLAS on bf16 weights (x as it is), f16 ones
// (x converted to f16, exactly), f32 ones (x widened), the quantized GEMV (m <= 8: bf16 x read 4
// at a time; q5_0 element by element) and bf16 slabs (m = 17), each with and without a bias,
// into a bf16 or an f32 y. The CPU multiplies the same bf16-rounded x in f32.
TEST(CudaBf16OpsTest, MatmulEveryWeightPath) {
  KVSERVE_REQUIRE_CUDA(gpu);
  cpu::CpuBackend cpu(nullptr);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0,
                      DType::kQ5_0, DType::kQ4_K, DType::kQ6_K}) {
    for (int64_t m : {1, 3, 17}) {
      for (bool bias : {false, true}) {
        for (DType y_dtype : {DType::kBF16, DType::kF32}) {
          const int64_t n = 67;
          const int64_t k = DTypeBlockElems(dtype) > 32 ? 512 : 96;
          const std::vector<uint8_t> w = MakeWeights(dtype, n, k, 11);
          const std::vector<float> x = Rounded(Random(m * k, 12));
          const std::vector<float> b = Random(n, 13, -3.0f, 3.0f);
          std::vector<float> want(m * n);
          cpu.Matmul(
              {x.data(), k, w.data(), dtype, bias ? b.data() : nullptr, want.data(), n, m, n, k});
          absl::StatusOr<PreparedMatrix> pw =
              gpu->PrepareMatrix(w.data(), dtype, n, k, MatrixUse::kMatmul);
          ASSERT_TRUE(pw.ok()) << pw.status();
          DeviceBuffer dx = Upload(gpu, ToBf16(x));
          DeviceBuffer db = Upload(gpu, b);
          DeviceBuffer dy = Upload(gpu, std::vector<float>(m * n));
          cpu::MatmulArgs a{static_cast<const float*>(dx.get()),
                            k,
                            pw->data,
                            pw->dtype,
                            bias ? db.as<float>() : nullptr,
                            dy.as<float>(),
                            n,
                            m,
                            n,
                            k};
          a.x_dtype = DType::kBF16;
          a.y_dtype = y_dtype;
          const int64_t conversions = ActivationConversions();
          gpu->Matmul(a);
          const std::vector<float> got = y_dtype == DType::kBF16
                                             ? FromBf16(Download<uint16_t>(gpu, dy.get(), m * n))
                                             : Download<float>(gpu, dy.get(), m * n);
          // The model's Linears on CUDA (bf16 or quantized weights, no bias: the q/k/v biases go
          // to the RoPE kernel) are one cuBLAS call or the GEMV, nothing else.
          if ((dtype == DType::kBF16 || DTypeIsQuantized(dtype)) && !bias) {
            EXPECT_EQ(ActivationConversions(), conversions)
                << DTypeName(dtype) << " m=" << m << " y " << DTypeName(y_dtype);
          }
          const float scale = MaxAbs(want);
          // Same x and weights on both sides: f32-order noise, except where the CPU rounds x to
          // 8 bits for its int8 dot products (quantized) and where slabs round the weights to
          // bf16 (quantized, m > 8); plus one bf16 rounding of y.
          const bool quantized = DTypeIsQuantized(dtype);
          const float tol = (quantized ? (m <= 8 ? 1e-2f : 1.5e-2f) : 1e-5f) +
                            (y_dtype == DType::kBF16 ? kBf16Rounding : 0.0f);
          EXPECT_LE(MaxAbsDiff(got, want), tol * scale)
              << DTypeName(dtype) << " m=" << m << (bias ? " bias" : "") << " y "
              << DTypeName(y_dtype);
        }
      }
    }
  }
}

// Quantized weights met by more than 8 bf16 x rows, over two slabs (the second partial), with a
// bias into a bf16 y: each slab's f32 product goes through the scratch, then bias and rounding.
TEST(CudaBf16OpsTest, QuantizedSlabsWithBiasIntoBf16) {
  KVSERVE_REQUIRE_CUDA(gpu);
  cpu::CpuBackend cpu(nullptr);
  const int64_t m = 9, n = 1100, k = 4096;
  const std::vector<uint8_t> w = MakeWeights(DType::kQ8_0, n, k, 21);
  const std::vector<float> x = Rounded(Random(m * k, 22));
  const std::vector<float> b = Random(n, 23, -3.0f, 3.0f);
  std::vector<float> want(m * n);
  cpu.Matmul({x.data(), k, w.data(), DType::kQ8_0, b.data(), want.data(), n, m, n, k});
  absl::StatusOr<PreparedMatrix> pw =
      gpu->PrepareMatrix(w.data(), DType::kQ8_0, n, k, MatrixUse::kMatmul);
  ASSERT_TRUE(pw.ok()) << pw.status();
  DeviceBuffer dx = Upload(gpu, ToBf16(x));
  DeviceBuffer db = Upload(gpu, b);
  DeviceBuffer dy = Upload(gpu, std::vector<uint16_t>(m * n));
  cpu::MatmulArgs a{static_cast<const float*>(dx.get()),
                    k,
                    pw->data,
                    pw->dtype,
                    db.as<float>(),
                    dy.as<float>(),
                    n,
                    m,
                    n,
                    k};
  a.x_dtype = DType::kBF16;
  a.y_dtype = DType::kBF16;
  gpu->Matmul(a);
  const std::vector<float> got = FromBf16(Download<uint16_t>(gpu, dy.get(), m * n));
  EXPECT_LE(MaxAbsDiff(got, want), (1.5e-2f + kBf16Rounding) * MaxAbs(want));
}

// The fused residual add + RMSNorm as the model runs it (f32 stream, bf16 y), and the in-place
// bf16 norms (Qwen3's q/k norms, MLA's latent norms).
TEST(CudaBf16OpsTest, RmsNorm) {
  KVSERVE_REQUIRE_CUDA(gpu);
  cpu::CpuBackend cpu(nullptr);
  for (int64_t rows : {1, 3, 17}) {
    for (int64_t dim : {64, 130, 4096}) {
      const std::vector<float> w = Random(dim, 3, 0.5f, 1.5f);
      DeviceBuffer dw = Upload(gpu, w);
      {  // f32 x + residual -> bf16 y; x becomes the f32 stream
        std::vector<float> x = Random(rows * dim, 1);
        const std::vector<float> res = Random(rows * dim, 2);
        DeviceBuffer dx = Upload(gpu, x), dres = Upload(gpu, res);
        DeviceBuffer dy = Upload(gpu, std::vector<uint16_t>(rows * dim));
        std::vector<float> y(rows * dim);
        cpu.RmsNorm({x.data(), res.data(), w.data(), y.data(), rows, dim, 1e-5f, dim, dim});
        cpu::RmsNormArgs g{dx.as<float>(),
                           dres.as<float>(),
                           dw.as<float>(),
                           dy.as<float>(),
                           rows,
                           dim,
                           1e-5f,
                           dim,
                           dim};
        g.y_dtype = DType::kBF16;
        gpu->RmsNorm(g);
        EXPECT_LE(MaxAbsDiff(FromBf16(Download<uint16_t>(gpu, dy.get(), rows * dim)), y),
                  kBf16Rounding * MaxAbs(y));
        EXPECT_LT(MaxAbsDiff(Download<float>(gpu, dx.get(), rows * dim), x), 1e-6f);
      }
      {  // bf16 in place
        std::vector<float> x = Rounded(Random(rows * dim, 4));
        DeviceBuffer dx = Upload(gpu, ToBf16(x));
        cpu.RmsNorm({x.data(), nullptr, w.data(), x.data(), rows, dim, 1e-5f, dim, dim});
        cpu::RmsNormArgs g{
            dx.as<float>(), nullptr, dw.as<float>(), dx.as<float>(), rows, dim, 1e-5f, dim, dim};
        g.x_dtype = g.y_dtype = DType::kBF16;
        gpu->RmsNorm(g);
        EXPECT_LE(MaxAbsDiff(FromBf16(Download<uint16_t>(gpu, dx.get(), rows * dim)), x),
                  kBf16Rounding * MaxAbs(x));
      }
    }
  }
}

// 1031 takes the element-by-element kernel (up starts 2062 bytes into a row), 1024 and 1032 the
// vector one (16 bytes, eight elements a thread; 1032 = 129 vectors, a part-warp at the end).
TEST(CudaBf16OpsTest, SiluMulInPlace) {
  KVSERVE_REQUIRE_CUDA(gpu);
  cpu::CpuBackend cpu(nullptr);
  for (const auto& [rows, dim] :
       {std::pair<int64_t, int64_t>{1, 1031}, {3, 1031}, {17, 1031}, {3, 1024}, {4, 1032}}) {
    // gate | up side by side in one row, as the stacked gate/up GEMM writes them.
    const std::vector<float> both = Rounded(Random(rows * 2 * dim, 4, -6.0f, 6.0f));
    std::vector<float> out(rows * dim);
    cpu.SiluMul({both.data(), both.data() + dim, out.data(), rows, dim, 2 * dim, 2 * dim, dim});
    DeviceBuffer d = Upload(gpu, ToBf16(both));
    auto* gate = static_cast<uint16_t*>(d.get());
    SiluMulArgs a{reinterpret_cast<float*>(gate),
                  reinterpret_cast<float*>(gate + dim),
                  reinterpret_cast<float*>(gate),
                  rows,
                  dim,
                  2 * dim,
                  2 * dim,
                  2 * dim,
                  DType::kBF16};
    gpu->SiluMul(a);
    const std::vector<float> got = FromBf16(Download<uint16_t>(gpu, d.get(), rows * 2 * dim));
    std::vector<float> got_out(rows * dim);
    for (int64_t r = 0; r < rows; ++r) {
      std::copy_n(got.begin() + r * 2 * dim, dim, got_out.begin() + r * dim);
    }
    EXPECT_LE(MaxAbsDiff(got_out, out), kBf16Rounding * MaxAbs(out));
  }
}

// Row gathers of bf16 activations (MoE's routed rows) are exact, and bf16 weights gathered into
// a bf16 out are too.
TEST(CudaBf16OpsTest, EmbeddingIntoBf16IsExact) {
  KVSERVE_REQUIRE_CUDA(gpu);
  const int64_t dim = 160, vocab = 37;
  const std::vector<uint16_t> table = ToBf16(Random(vocab * dim, 7));
  const std::vector<int32_t> ids = {0, 36, 5, 5, 17, 1, 30};
  const int64_t n = static_cast<int64_t>(ids.size());
  DeviceBuffer dt = Upload(gpu, table), dids = Upload(gpu, ids);
  DeviceBuffer dout = Upload(gpu, std::vector<uint16_t>(n * dim));
  gpu->Embedding(
      {dt.get(), DType::kBF16, dim, dids.as<int32_t>(), n, dout.as<float>(), DType::kBF16});
  const std::vector<uint16_t> got = Download<uint16_t>(gpu, dout.get(), n * dim);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_TRUE(std::equal(got.begin() + i * dim, got.begin() + (i + 1) * dim,
                           table.begin() + ids[i] * dim))
        << "row " << i;
  }
}

// RoPE + KV write on bf16 q/k/v, stacked in one row as the q/k/v GEMM writes them, with the q/k/v
// biases fused (added in f32 before the rotation; q and k rounded once), for both rope layouts,
// an f32 and a bf16 cache, and a padding token.
TEST(CudaBf16OpsTest, RopeKvWriteWithBiases) {
  KVSERVE_REQUIRE_CUDA(gpu);
  cpu::CpuBackend cpu(nullptr);
  for (KvCacheDType dtype : {KvCacheDType::kF32, KvCacheDType::kBF16}) {
    for (cpu::RopeLayout rl : {cpu::RopeLayout::kInterleaved, cpu::RopeLayout::kHalfSplit}) {
      const int64_t t = 17, heads = 8, kv_heads = 2, head_dim = 64, block_size = 16;
      const int64_t num_blocks = 4;
      const int64_t q_dim = heads * head_dim, kv_dim = kv_heads * head_dim;
      const int64_t stride = q_dim + 2 * kv_dim;
      const std::vector<float> qkv = Rounded(Random(t * stride, 31, -2.0f, 2.0f));
      const std::vector<float> bias = Random(stride, 34, -3.0f, 3.0f);
      std::vector<int32_t> pos(t);
      std::vector<int64_t> slots(t);
      for (int64_t i = 0; i < t; ++i) {
        pos[i] = static_cast<int32_t>(i * 61 % 997);
        slots[i] = i == 3 ? -1 : (i * 5) % (num_blocks * block_size);
      }
      std::vector<float> inv(head_dim / 2);
      for (int64_t i = 0; i < head_dim / 2; ++i) inv[i] = std::pow(10000.0f, -2.0f * i / head_dim);
      const cpu::PagedKvLayout layout{kv_heads, head_dim, block_size, dtype};
      const int64_t rows = num_blocks * kv_heads * block_size;
      const int64_t bytes = rows * head_dim * KvCacheDTypeElemBytes(dtype);
      // CPU: q, k, v apart (its twin adds the biases too).
      std::vector<float> q(t * q_dim), k(t * kv_dim), v(t * kv_dim);
      for (int64_t i = 0; i < t; ++i) {
        std::copy_n(qkv.begin() + i * stride, q_dim, q.begin() + i * q_dim);
        std::copy_n(qkv.begin() + i * stride + q_dim, kv_dim, k.begin() + i * kv_dim);
        std::copy_n(qkv.begin() + i * stride + q_dim + kv_dim, kv_dim, v.begin() + i * kv_dim);
      }
      std::vector<uint8_t> kc(bytes), vc(bytes);
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
                        {kc.data(), nullptr},
                        {vc.data(), nullptr}};
      a.q_bias = bias.data();
      a.k_bias = bias.data() + q_dim;
      a.v_bias = bias.data() + q_dim + kv_dim;
      cpu.RopeKvWrite(a);
      ASSERT_TRUE(cpu.Synchronize().ok());
      DeviceBuffer dqkv = Upload(gpu, ToBf16(qkv)), dbias = Upload(gpu, bias);
      DeviceBuffer dpos = Upload(gpu, pos), dslots = Upload(gpu, slots), dinv = Upload(gpu, inv);
      DeviceBuffer dkc = Upload(gpu, std::vector<uint8_t>(bytes));
      DeviceBuffer dvc = Upload(gpu, std::vector<uint8_t>(bytes));
      auto* base = static_cast<uint16_t*>(dqkv.get());
      RopeKvWriteArgs g{reinterpret_cast<float*>(base),
                        reinterpret_cast<float*>(base + q_dim),
                        reinterpret_cast<const float*>(base + q_dim + kv_dim),
                        t,
                        heads,
                        stride,
                        stride,
                        stride,
                        dpos.as<int32_t>(),
                        dinv.as<float>(),
                        rl,
                        dslots.as<int64_t>(),
                        layout,
                        {dkc.get(), nullptr},
                        {dvc.get(), nullptr}};
      g.dtype = DType::kBF16;
      g.q_bias = dbias.as<float>();
      g.k_bias = dbias.as<float>() + q_dim;
      g.v_bias = dbias.as<float>() + q_dim + kv_dim;
      gpu->RopeKvWrite(g);
      const std::vector<float> got = FromBf16(Download<uint16_t>(gpu, dqkv.get(), t * stride));
      std::vector<float> got_q(t * q_dim), got_k(t * kv_dim), got_v(t * kv_dim);
      for (int64_t i = 0; i < t; ++i) {
        std::copy_n(got.begin() + i * stride, q_dim, got_q.begin() + i * q_dim);
        std::copy_n(got.begin() + i * stride + q_dim, kv_dim, got_k.begin() + i * kv_dim);
        std::copy_n(got.begin() + i * stride + q_dim + kv_dim, kv_dim, got_v.begin() + i * kv_dim);
      }
      const std::string what = std::string(KvCacheDTypeName(dtype)) + " cache";
      EXPECT_LE(MaxAbsDiff(got_q, q), kBf16Rounding * MaxAbs(q)) << what;
      EXPECT_LE(MaxAbsDiff(got_k, k), kBf16Rounding * MaxAbs(k)) << what;
      // v is read, not written: its bias goes to the cache only.
      for (int64_t i = 0; i < t; ++i) {
        EXPECT_TRUE(std::equal(got_v.begin() + i * kv_dim, got_v.begin() + (i + 1) * kv_dim,
                               qkv.begin() + i * stride + q_dim + kv_dim))
            << what << " v row " << i << " was written";
      }
      // Cache rows: k rounded once more in bf16 (GPU) vs f32 (CPU), then by the cache dtype.
      const std::vector<uint8_t> gk = Download<uint8_t>(gpu, dkc.get(), bytes);
      const std::vector<uint8_t> gv = Download<uint8_t>(gpu, dvc.get(), bytes);
      const int64_t eb = KvCacheDTypeElemBytes(dtype);
      std::vector<float> a_row(head_dim), b_row(head_dim);
      float worst = 0.0f;
      for (int64_t r = 0; r < rows; ++r) {
        for (const auto& [cpu_rows, gpu_rows] : {std::pair{&kc, &gk}, std::pair{&vc, &gv}}) {
          cpu::DecodeKvVector(dtype, cpu_rows->data() + r * head_dim * eb, 1.0f, head_dim,
                              a_row.data());
          cpu::DecodeKvVector(dtype, gpu_rows->data() + r * head_dim * eb, 1.0f, head_dim,
                              b_row.data());
          worst = std::max(worst, MaxAbsDiff(a_row, b_row));
        }
      }
      // |k + bias| <= 5: two bf16 roundings of 5 * 2^-9 at most.
      EXPECT_LE(worst, 2.5e-2f) << what;
    }
  }
}

}  // namespace
}  // namespace kvserve
