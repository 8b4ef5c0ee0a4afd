// CpuBackend's share of bf16 activations (Backend::activation_dtype): it keeps f32, refuses an op
// asked for another dtype with a FAILED_PRECONDITION naming it at the next Synchronize (once),
// and serves the q/k/v biases of the RoPE + KV write (the CPU twin of the CUDA fusion). Weights:
// q4_0 / q8_0 Matmul weights are packed at PrepareMatrix, everything else used in place.

#include "kernels/cpu/cpu_backend.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/block_quant.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/packed_weights.h"
#include "kernels/cpu/paged_attention.h"

namespace kvserve::cpu {
namespace {

TEST(CpuBackendTest, KeepsF32ActivationsAndRefusesBf16Ops) {
  CpuBackend cpu(nullptr);
  EXPECT_EQ(cpu.activation_dtype(), DType::kF32);
  std::vector<float> x(8, 1.0f), w(8, 1.0f), y(8, -7.0f);
  RmsNormArgs a{x.data(), nullptr, w.data(), y.data(), 1, 8, 1e-5f, 8, 8};
  a.y_dtype = DType::kBF16;
  cpu.RmsNorm(a);
  EXPECT_EQ(y[0], -7.0f) << "a refused op must not run";
  const absl::Status s = cpu.Synchronize();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("rms_norm"), std::string_view::npos) << s;
  EXPECT_NE(s.message().find("bf16"), std::string_view::npos) << s;
  EXPECT_TRUE(cpu.Synchronize().ok()) << "reported once";
  a.y_dtype = DType::kF32;
  cpu.RmsNorm(a);
  EXPECT_TRUE(cpu.Synchronize().ok());
  EXPECT_NEAR(y[0], 1.0f, 1e-5f);
}

// q4_0 / q8_0 / K-quant weights for Matmul are packed (PackRows' bytes, flagged, owned by the
// matrix) and give cpu::Matmul's packed result; for Embedding, in other dtypes or with
// KVSERVE_CPU_PACK_WEIGHTS=0 the matrix is the caller's bytes in place.
TEST(CpuBackendTest, PrepareMatrixPacksQuantizedMatmulWeights) {
  CpuBackend cpu(nullptr);
  const int64_t rows = 40, cols = 256;
  std::mt19937 rng(4);
  std::normal_distribution<float> normal;
  std::vector<float> wf(static_cast<size_t>(rows * cols)), x(static_cast<size_t>(cols));
  for (float& v : wf) v = normal(rng);
  for (float& v : x) v = normal(rng);
  for (DType dtype : {DType::kQ4_0, DType::kQ8_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    std::vector<uint8_t> w(static_cast<size_t>(rows * DTypeRowBytes(dtype, cols)));
    for (int64_t r = 0; r < rows; ++r) {
      QuantizeRow(&wf[r * cols], dtype, cols, &w[r * DTypeRowBytes(dtype, cols)]);
    }
    absl::StatusOr<PreparedMatrix> m =
        cpu.PrepareMatrix(w.data(), dtype, rows, cols, MatrixUse::kMatmul);
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE(m->packed);
    ASSERT_NE(m->data, w.data());
    ASSERT_EQ(m->storage.get(), nullptr) << "the backend owns packed weights";
    std::vector<uint8_t> expect(static_cast<size_t>(PackedBytes(dtype, rows, cols)));
    PackRows(w.data(), dtype, rows, cols, expect.data());
    ASSERT_EQ(0, std::memcmp(m->data, expect.data(), expect.size()));
    std::vector<float> y(rows), direct(rows);
    MatmulArgs args{x.data(), cols, m->data, dtype, nullptr, y.data(), rows, 1, rows, cols};
    args.w_packed = true;
    cpu.Matmul(args);
    ASSERT_TRUE(cpu.Synchronize().ok());
    args.y = direct.data();
    Matmul(args, nullptr);
    EXPECT_EQ(0, std::memcmp(y.data(), direct.data(), y.size() * sizeof(float)));

    absl::StatusOr<PreparedMatrix> gather =
        cpu.PrepareMatrix(w.data(), dtype, rows, cols, MatrixUse::kEmbedding);
    ASSERT_TRUE(gather.ok()) << gather.status();
    EXPECT_FALSE(gather->packed);
    EXPECT_EQ(gather->data, w.data());

    ASSERT_EQ(0, setenv("KVSERVE_CPU_PACK_WEIGHTS", "0", 1));
    absl::StatusOr<PreparedMatrix> off =
        cpu.PrepareMatrix(w.data(), dtype, rows, cols, MatrixUse::kMatmul);
    ASSERT_EQ(0, unsetenv("KVSERVE_CPU_PACK_WEIGHTS"));
    ASSERT_TRUE(off.ok()) << off.status();
    EXPECT_FALSE(off->packed);
    EXPECT_EQ(off->data, w.data());
  }
  absl::StatusOr<PreparedMatrix> f32 =
      cpu.PrepareMatrix(wf.data(), DType::kF32, rows, cols, MatrixUse::kMatmul);
  ASSERT_TRUE(f32.ok()) << f32.status();
  // f32 is packed only where the avx512 path multiplies it (packed_weights.h).
  EXPECT_EQ(f32->packed, PackedLayoutSupported(DType::kF32));
  if (f32->packed) {
    std::vector<float> unpacked(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      UnpackRow(f32->data, DType::kF32, cols, r, unpacked.data());
      EXPECT_EQ(0, std::memcmp(unpacked.data(), &wf[static_cast<size_t>(r * cols)],
                               static_cast<size_t>(cols) * sizeof(float)));
    }
  } else {
    EXPECT_EQ(f32->data, wf.data());
  }
}

// RoPE + KV write with biases = the same without, on q/k/v that already hold the biases.
TEST(CpuBackendTest, RopeKvWriteAddsTheBiasesFirst) {
  CpuBackend cpu(nullptr);
  const int64_t t = 3, heads = 2, kv_heads = 1, d = 8, bs = 4;
  const int64_t q_dim = heads * d, kv_dim = kv_heads * d;
  std::vector<float> q(t * q_dim), k(t * kv_dim), v(t * kv_dim);
  std::vector<float> bq(q_dim), bk(kv_dim), bv(kv_dim);
  for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.3f * static_cast<float>(i));
  for (size_t i = 0; i < k.size(); ++i) k[i] = std::cos(0.7f * static_cast<float>(i));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(1.1f * static_cast<float>(i) + 1.0f);
  for (size_t i = 0; i < bq.size(); ++i) bq[i] = 0.5f - 0.1f * static_cast<float>(i);
  for (size_t i = 0; i < bk.size(); ++i) bk[i] = 0.2f * static_cast<float>(i);
  for (size_t i = 0; i < bv.size(); ++i) bv[i] = -1.0f + 0.25f * static_cast<float>(i);
  std::vector<float> q2 = q, k2 = k, v2 = v;
  for (int64_t r = 0; r < t; ++r) {
    for (int64_t i = 0; i < q_dim; ++i) q2[r * q_dim + i] += bq[i];
    for (int64_t i = 0; i < kv_dim; ++i) {
      k2[r * kv_dim + i] += bk[i];
      v2[r * kv_dim + i] += bv[i];
    }
  }
  const std::vector<int32_t> pos = {0, 5, 9};
  const std::vector<int64_t> slots = {1, 2, 6};
  const std::vector<float> inv = {1.0f, 0.1f, 0.01f, 0.001f};
  const PagedKvLayout layout{kv_heads, d, bs, KvCacheDType::kF32};
  std::vector<float> kc(2 * bs * d), vc(2 * bs * d), kc2(kc.size()), vc2(vc.size());
  const std::vector<float> v_before = v;
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
                    RopeLayout::kHalfSplit,
                    slots.data(),
                    layout,
                    kc.data(),
                    vc.data()};
  a.q_bias = bq.data();
  a.k_bias = bk.data();
  a.v_bias = bv.data();
  cpu.RopeKvWrite(a);
  RopeKvWriteArgs b{q2.data(),
                    k2.data(),
                    v2.data(),
                    t,
                    heads,
                    q_dim,
                    kv_dim,
                    kv_dim,
                    pos.data(),
                    inv.data(),
                    RopeLayout::kHalfSplit,
                    slots.data(),
                    layout,
                    kc2.data(),
                    vc2.data()};
  cpu.RopeKvWrite(b);
  ASSERT_TRUE(cpu.Synchronize().ok());
  EXPECT_EQ(q, q2);
  EXPECT_EQ(k, k2);
  EXPECT_EQ(kc, kc2);
  EXPECT_EQ(vc, vc2);
  EXPECT_EQ(v, v_before) << "v is read, not written";
}

}  // namespace
}  // namespace kvserve::cpu
