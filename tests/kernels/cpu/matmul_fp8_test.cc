// FP8 E4M3 weights with per-row scales (DType::kF8E4M3; kernels/cpu/matmul_fp8.h), checked
// against the format's definition: the row quantizer picks the nearest code of x / (absmax /
// 448) (ties to the even code) by brute force over every finite code, and the matmul equals
// the double-precision sum of the decoded products times both scales.

#include "kernels/cpu/matmul_fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/convert.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/packed_weights.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/kernels/cpu/kernel_test_util.h"

namespace kvserve::cpu {
namespace {

using testing::RefFp8E4M3Decode;

// The finite E4M3 code nearest to v (|v| <= 448), ties to the code with an even low bit.
int RefNearestCode(double v) {
  int best = -1;
  double best_err = 0.0;
  for (int code = 0; code < 256; ++code) {
    const double d = RefFp8E4M3Decode(code);
    if (std::isnan(d)) continue;
    if (d == 0.0 && (code & 0x80) != (std::signbit(v) ? 0x80 : 0)) continue;  // the zero's sign
    const double err = std::fabs(d - v);
    if (best < 0 || err < best_err || (err == best_err && (code & 1) == 0)) {
      best = code;
      best_err = err;
    }
  }
  return best;
}

// Quantizes one f32 row by the definition: scale = absmax / 448 (in f32, as the format's users
// compute it), codes = nearest(x / scale).
float RefQuantizeRow(const float* x, int64_t n, std::vector<int>* codes) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float s = amax / 448.0f;
  codes->assign(static_cast<size_t>(n), 0);
  for (int64_t i = 0; i < n; ++i) {
    if (s != 0.0f) (*codes)[i] = RefNearestCode(static_cast<double>(x[i] / s));
  }
  return s;
}

std::vector<float> Normal(size_t n, std::mt19937& rng, float sigma = 1.0f) {
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> v(n);
  for (float& e : v) e = normal(rng);
  return v;
}

TEST(MatmulFp8Test, RowQuantizerPicksTheNearestCodeOfEveryStoredType) {
  std::mt19937 rng(11);
  const int64_t rows = 6, cols = 200;
  std::vector<float> x = Normal(static_cast<size_t>(rows * cols), rng, 3.0f);
  for (int64_t c = 0; c < cols; ++c) x[2 * cols + c] = 0.0f;  // an all-zero row
  x[3 * cols + 5] = 1e-6f;                                    // a subnormal code's range
  x[4 * cols + 7] = 1e4f;                                     // one large element
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    // The stored row and its exact f32 values.
    std::vector<uint8_t> stored(static_cast<size_t>(rows * DTypeRowBytes(dtype, cols)));
    std::vector<float> values(x.size());
    for (int64_t r = 0; r < rows; ++r) {
      uint8_t* row = stored.data() + r * DTypeRowBytes(dtype, cols);
      ConvertRowFromF32(&x[r * cols], cols, dtype, row);
      ConvertRowToF32(row, dtype, cols, &values[r * cols]);
    }
    std::vector<uint8_t> codes(static_cast<size_t>(rows * cols), 0xaa);
    std::vector<float> scales(static_cast<size_t>(rows), -1.0f);
    ThreadPool pool(3);
    QuantizeRowsFp8(stored.data(), dtype, rows, cols, codes.data(), scales.data(), &pool);
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<int> want;
      const float s = RefQuantizeRow(&values[r * cols], cols, &want);
      ASSERT_EQ(scales[r], s) << "row " << r;
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(codes[r * cols + c], want[c]) << "row " << r << " col " << c;
      }
    }
    EXPECT_EQ(scales[2], 0.0f);
  }
}

struct Fp8Problem {
  int64_t m, n, k;
  std::vector<float> x, bias;
  std::vector<uint8_t> w;  // codes [n, k]
  std::vector<float> w_scale;
};

Fp8Problem MakeProblem(int64_t m, int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  Fp8Problem p{m, n, k};
  p.x = Normal(static_cast<size_t>(m * k), rng, 2.0f);
  p.bias = Normal(static_cast<size_t>(n), rng);
  const std::vector<float> wf = Normal(static_cast<size_t>(n * k), rng, 0.05f);
  p.w.resize(static_cast<size_t>(n * k));
  p.w_scale.resize(static_cast<size_t>(n));
  QuantizeRowsFp8(wf.data(), DType::kF32, n, k, p.w.data(), p.w_scale.data(), nullptr);
  return p;
}

MatmulArgs ArgsFor(const Fp8Problem& p, std::vector<float>* y, bool bias) {
  y->assign(static_cast<size_t>(p.m * p.n), -7.0f);
  MatmulArgs a{
      p.x.data(), p.k, p.w.data(), DType::kF8E4M3, bias ? p.bias.data() : nullptr, y->data(), p.n,
      p.m,        p.n, p.k};
  a.w_scale = p.w_scale.data();
  return a;
}

TEST(MatmulFp8Test, MatchesTheDefinitionInDoublePrecision) {
  for (int64_t k : {16, 100, 512}) {
    SCOPED_TRACE(k);
    const Fp8Problem p = MakeProblem(5, 37, k, 3);
    std::vector<float> y;
    MatmulFp8(ArgsFor(p, &y, /*bias=*/true), nullptr);
    for (int64_t i = 0; i < p.m; ++i) {
      std::vector<int> xq;
      const double xs = RefQuantizeRow(&p.x[i * k], k, &xq);
      for (int64_t j = 0; j < p.n; ++j) {
        double sum = 0.0, mag = 0.0;
        for (int64_t c = 0; c < k; ++c) {
          const double t = RefFp8E4M3Decode(xq[c]) * RefFp8E4M3Decode(p.w[j * k + c]);
          sum += t;
          mag += std::fabs(t);
        }
        const double scale = xs * p.w_scale[j];
        const double want = sum * scale + p.bias[j];
        // f32 sums of exact products: a few ulps of the magnitude summed.
        ASSERT_NEAR(y[i * p.n + j], want, 1e-6 * mag * scale + 1e-6 * std::fabs(want))
            << "y[" << i << ", " << j << "]";
      }
    }
  }
}

TEST(MatmulFp8Test, StaysNearTheUnquantizedProduct) {
  std::mt19937 rng(5);
  const int64_t m = 3, n = 24, k = 256;
  const std::vector<float> x = Normal(static_cast<size_t>(m * k), rng);
  const std::vector<float> wf = Normal(static_cast<size_t>(n * k), rng, 0.1f);
  std::vector<uint8_t> w(static_cast<size_t>(n * k));
  std::vector<float> ws(static_cast<size_t>(n));
  QuantizeRowsFp8(wf.data(), DType::kF32, n, k, w.data(), ws.data(), nullptr);
  std::vector<float> y(static_cast<size_t>(m * n)), want(y.size());
  MatmulArgs a{x.data(), k, w.data(), DType::kF8E4M3, nullptr, y.data(), n, m, n, k};
  a.w_scale = ws.data();
  Matmul(a, nullptr);
  MatmulArgs f{x.data(), k, wf.data(), DType::kF32, nullptr, want.data(), n, m, n, k};
  Matmul(f, nullptr);
  // E4M3 keeps 3 mantissa bits: each product within ~2 * 2^-4 relative; the sum's error grows
  // like sqrt(k) of that against a sum that also grows like sqrt(k).
  double err = 0.0, ref = 0.0;
  for (size_t i = 0; i < y.size(); ++i) {
    err = std::max(err, static_cast<double>(std::fabs(y[i] - want[i])));
    ref = std::max(ref, static_cast<double>(std::fabs(want[i])));
  }
  EXPECT_LT(err, 0.08 * ref) << "max error " << err << " of max |y| " << ref;
  EXPECT_GT(err, 0.0) << "FP8 must round somewhere";
}

// A row's result depends on that row alone (its own activation scale), not on the batch or on
// the thread count; NaN and zero rows stay in their rows.
TEST(MatmulFp8Test, RowsAreIndependentOfBatchAndThreads) {
  Fp8Problem p = MakeProblem(6, 70, 96, 9);
  for (int64_t c = 0; c < p.k; ++c) p.x[4 * p.k + c] = 0.0f;
  p.x[5 * p.k + 3] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> batched;
  ThreadPool pool(3);
  MatmulFp8(ArgsFor(p, &batched, true), &pool);
  for (int64_t i = 0; i < p.m; ++i) {
    Fp8Problem one = p;
    one.m = 1;
    one.x.assign(p.x.begin() + i * p.k, p.x.begin() + (i + 1) * p.k);
    std::vector<float> alone;
    MatmulFp8(ArgsFor(one, &alone, true), nullptr);
    for (int64_t j = 0; j < p.n; ++j) {
      const float b = batched[i * p.n + j];
      if (i == 5) {
        ASSERT_TRUE(std::isnan(b) && std::isnan(alone[j])) << "a NaN row stays NaN";
        continue;
      }
      ASSERT_EQ(b, alone[j]) << "row " << i << " col " << j;
      if (i == 4) {
        ASSERT_EQ(b, p.bias[j]) << "a zero row gives the bias";
      }
    }
  }
}

// Under set_fp8_weights the CPU backend quantizes f32 / f16 / bf16 kMatmul weights (the codes
// and scales QuantizeRowsFp8 makes) and keeps kMatmulKeepPrecision, kEmbedding and
// block-quantized matrices as they are.
TEST(MatmulFp8Test, CpuBackendQuantizesOnlyFloatMatmulWeights) {
  CpuBackend cpu(nullptr);
  cpu.set_fp8_weights(true);
  std::mt19937 rng(2);
  const int64_t rows = 20, cols = 64;
  const std::vector<float> wf = Normal(static_cast<size_t>(rows * cols), rng);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    std::vector<uint8_t> stored(static_cast<size_t>(rows * DTypeRowBytes(dtype, cols)));
    for (int64_t r = 0; r < rows; ++r) {
      ConvertRowFromF32(&wf[r * cols], cols, dtype, &stored[r * DTypeRowBytes(dtype, cols)]);
    }
    absl::StatusOr<PreparedMatrix> m =
        cpu.PrepareMatrix(stored.data(), dtype, rows, cols, MatrixUse::kMatmul);
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_EQ(m->dtype, DType::kF8E4M3);
    ASSERT_NE(m->scales, nullptr);
    std::vector<uint8_t> codes(static_cast<size_t>(rows * cols));
    std::vector<float> scales(static_cast<size_t>(rows));
    QuantizeRowsFp8(stored.data(), dtype, rows, cols, codes.data(), scales.data(), nullptr);
    EXPECT_EQ(std::memcmp(m->data, codes.data(), codes.size()), 0);
    EXPECT_EQ(std::memcmp(m->scales, scales.data(), sizeof(float) * rows), 0);
    for (MatrixUse use : {MatrixUse::kMatmulKeepPrecision, MatrixUse::kEmbedding}) {
      absl::StatusOr<PreparedMatrix> kept =
          cpu.PrepareMatrix(stored.data(), dtype, rows, cols, use);
      ASSERT_TRUE(kept.ok()) << kept.status();
      EXPECT_EQ(kept->dtype, dtype);
      // Kept in its precision; a kept Matmul matrix is packed where its dtype has a packed
      // layout on this path (bf16 with vdpbf16ps), else used in place.
      const bool packed = use == MatrixUse::kMatmulKeepPrecision && PackedLayoutSupported(dtype);
      EXPECT_EQ(kept->packed, packed);
      if (!packed) {
        EXPECT_EQ(kept->data, stored.data());
      }
      EXPECT_EQ(kept->scales, nullptr);
    }
  }
  std::vector<uint8_t> q8(static_cast<size_t>(rows * DTypeRowBytes(DType::kQ8_0, cols)));
  for (int64_t r = 0; r < rows; ++r) {
    ConvertRowFromF32(&wf[r * cols], cols, DType::kQ8_0,
                      &q8[r * DTypeRowBytes(DType::kQ8_0, cols)]);
  }
  absl::StatusOr<PreparedMatrix> q =
      cpu.PrepareMatrix(q8.data(), DType::kQ8_0, rows, cols, MatrixUse::kMatmul);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->dtype, DType::kQ8_0);
}

}  // namespace
}  // namespace kvserve::cpu
