#include "kernels/cpu/matmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/matmul_impl.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/kernels/cpu/kernel_test_util.h"
#include "tests/test_util/ci_skip.h"

namespace kvserve::cpu {
namespace {

using testing::DecodeRows;
using testing::EncodeRows;
using testing::MatmulPath;
using testing::MatmulPaths;
using testing::RandomFloats;
using testing::RoundToBf16;
using testing::ScopedIsa;
using testing::ScopedPath;

constexpr DType kAllDTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0,
                                DType::kQ4_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K,
                                DType::kQ4_1, DType::kQ5_0, DType::kQ5_1};

bool IsQuantized(DType t) { return DTypeBlockElems(t) > 1; }

// Quantized weights (but q4_1, q5_0, q5_1: internal::UsesInt8Activations) run against int8
// activations: each block of `scale_block` elements of an x row (32; 256 for the K-quants)
// becomes d * q with d = max|x| / 127 and q = x * (127 / max|x|) rounded to nearest, ties to even
// (fp32 arithmetic, as kernels/cpu/matmul_impl.h specifies). Written here from that description.
int64_t ScaleBlock(DType dtype) { return DTypeBlockElems(dtype) == 256 ? 256 : 32; }

std::vector<double> Int8Activations(const float* x, int64_t k, int64_t scale_block) {
  std::vector<double> out(static_cast<size_t>(k));
  for (int64_t b = 0; b < k / scale_block; ++b) {
    float amax = 0.0f;
    for (int64_t j = 0; j < scale_block; ++j) {
      amax = std::max(amax, std::fabs(x[b * scale_block + j]));
    }
    const float d = amax / 127.0f;
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t j = 0; j < scale_block; ++j) {
      const float q = std::nearbyint(x[b * scale_block + j] * inv);
      out[b * scale_block + j] = static_cast<double>(q) * d;
    }
  }
  return out;
}

// The x row as the active path multiplies it: int8 blocks, bf16, or as given.
std::vector<double> PathActivations(DType dtype, const float* x, int64_t k) {
  if (internal::UsesInt8Activations(dtype)) return Int8Activations(x, k, ScaleBlock(dtype));
  std::vector<double> out(x, x + k);
  if (internal::RoundsXToBf16(dtype)) {
    for (double& v : out) v = RoundToBf16(static_cast<float>(v));
  }
  return out;
}

// The weights reach every path exactly (fp16/bf16 widen exactly, q * d is exact in fp32; int8
// dot products are exact integers), so the only error is fp32 summation and the rounding of
// d_w * d_x: bound it relative to sum |x| |w| (worst case ~ (k / lanes) * eps; observed errors
// are far smaller). The same bound therefore fits every dtype.
double Tolerance(DType /*dtype*/, double sum_abs) { return 2e-5 * sum_abs + 1e-30; }

// One test problem: x [m, k] at stride k + 3, W [n, k] in dtype, bias, y at stride n + 5.
struct Problem {
  int64_t m, n, k;
  DType dtype;
  bool with_bias;
  std::vector<float> x;
  std::vector<uint8_t> w;
  std::vector<double> w_ref;
  std::vector<float> bias;

  Problem(int64_t m_in, int64_t n_in, int64_t k_in, DType dtype_in, bool with_bias_in,
          uint32_t seed)
      : m(m_in), n(n_in), k(k_in), dtype(dtype_in), with_bias(with_bias_in) {
    std::mt19937 rng(seed);
    x = RandomFloats(static_cast<size_t>(m * x_stride()), rng);
    const std::vector<float> wf = RandomFloats(static_cast<size_t>(n * k), rng);
    w = EncodeRows(dtype, wf, n, k);
    w_ref = DecodeRows(dtype, w, n, k);
    bias = RandomFloats(static_cast<size_t>(n), rng);
  }
  int64_t x_stride() const { return k + 3; }
  int64_t y_stride() const { return n + 5; }

  std::vector<float> Run(ThreadPool* pool) const {
    std::vector<float> y(static_cast<size_t>(m * y_stride()), -7.0f);
    Matmul(Args(x.data(), m, y.data()), pool);
    return y;
  }
  MatmulArgs Args(const float* xs, int64_t rows, float* y) const {
    return MatmulArgs{xs, x_stride(), w.data(), dtype, with_bias ? bias.data() : nullptr,
                      y,  y_stride(), rows,     n,     k};
  }
};

void ExpectMatchesReference(const Problem& p, const std::vector<float>& y) {
  for (int64_t i = 0; i < p.m; ++i) {
    const float* x = &p.x[i * p.x_stride()];
    const std::vector<double> xr = PathActivations(p.dtype, x, p.k);
    for (int64_t j = 0; j < p.n; ++j) {
      double ref = p.with_bias ? p.bias[j] : 0.0;
      double sum_abs = p.with_bias ? std::fabs(p.bias[j]) : 0.0;
      for (int64_t e = 0; e < p.k; ++e) {
        const double prod = xr[e] * p.w_ref[j * p.k + e];
        ref += prod;
        sum_abs += std::fabs(prod);
      }
      const float got = y[i * p.y_stride() + j];
      ASSERT_NEAR(got, ref, Tolerance(p.dtype, sum_abs)) << "row " << i << " col " << j;
    }
    // Padding between rows is untouched.
    for (int64_t j = p.n; j < p.y_stride() && i + 1 < p.m; ++j) {
      ASSERT_EQ(y[i * p.y_stride() + j], -7.0f);
    }
  }
}

TEST(MatmulTest, EveryIsaAndDTypeMatchesDoubleReference) {
  uint32_t seed = 1;
  for (DType dtype : kAllDTypes) {
    const std::vector<int64_t> ks =
        DTypeBlockElems(dtype) == 256 ? std::vector<int64_t>{256, 768, 4096}
        : IsQuantized(dtype)          ? std::vector<int64_t>{32, 64, 96, 4096}
                                      : std::vector<int64_t>{1, 7, 16, 33, 96, 4096};
    for (int64_t k : ks) {
      for (int64_t n : {1, 7, 33, 100}) {
        for (int64_t m : {1, 3, 17}) {
          const Problem p(m, n, k, dtype, /*with_bias=*/(n % 2) == 1, seed++);
          for (const MatmulPath& path : MatmulPaths()) {
            const ScopedPath scoped(path);
            SCOPED_TRACE(std::string(DTypeName(dtype)) + " " + path.Name() + " m=" +
                         std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k));
            ExpectMatchesReference(p, p.Run(nullptr));
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

TEST(MatmulTest, SimdPathsAgreeWithScalar) {
  for (DType dtype : kAllDTypes) {
    const Problem p(5, 37, 4096, dtype, true, 99);
    // The bf16 dot product multiplies x rounded to bf16: the scalar path gets that x too.
    Problem rounded = p;
    for (float& v : rounded.x) v = RoundToBf16(v);
    std::vector<float> scalar, scalar_rounded;
    {
      const ScopedIsa scoped(CpuIsa::kScalar);
      scalar = p.Run(nullptr);
      scalar_rounded = rounded.Run(nullptr);
    }
    for (const MatmulPath& path : MatmulPaths()) {
      const ScopedPath scoped(path);
      const std::vector<float> y = p.Run(nullptr);
      const std::vector<float>& want = internal::RoundsXToBf16(dtype) ? scalar_rounded : scalar;
      for (int64_t i = 0; i < p.m; ++i) {
        for (int64_t j = 0; j < p.n; ++j) {
          const float a = want[i * p.y_stride() + j];
          ASSERT_NEAR(y[i * p.y_stride() + j], a, 1e-4 * (1.0 + std::fabs(a)))
              << DTypeName(dtype) << " " << path.Name();
        }
      }
    }
  }
}

// Bit-identical results whatever the batch size, the row's position in the batch, the thread
// count or the chunking, on every ISA path.
TEST(MatmulTest, ResultsAreBitIdenticalAcrossBatchingAndThreads) {
  ThreadPool pool1(1), pool2(2), pool3(3);
  for (DType dtype : kAllDTypes) {
    // Float formats also at k = 20, 36, 48, 77 and 104: partial final steps (AVX2 bf16 works in
    // 16-element groups whose two vectors hold elements 0-3 + 8-11 and 4-7 + 12-15, AVX-512 f16
    // and bf16 in 32-element steps of two vectors, every path in 8 or 16 lanes), and a masked
    // step with a whole zero vector (AVX-512 f16 at k = 20 and 48).
    std::vector<int64_t> ks = {DTypeBlockElems(dtype) == 256 ? int64_t{256} : int64_t{96}, 4096};
    if (DTypeBlockElems(dtype) == 1) ks.insert(ks.end(), {20, 36, 48, 77, 104});
    for (int64_t k : ks) {
      const int64_t m = 17;
      const Problem p(m, 37, k, dtype, true, 7);
      for (const MatmulPath& path : MatmulPaths()) {
        const ScopedPath scoped(path);
        SCOPED_TRACE(std::string(DTypeName(dtype)) + " " + path.Name() + " k=" + std::to_string(k));
        const std::vector<float> base = p.Run(nullptr);
        for (ThreadPool* pool : {&pool1, &pool2, &pool3}) {
          const std::vector<float> y = p.Run(pool);
          ASSERT_EQ(0, std::memcmp(y.data(), base.data(), y.size() * sizeof(float)))
              << pool->num_threads() << " threads";
        }
        // Each row alone (m = 1), and rotated to a different position in the batch.
        std::vector<float> rotated_x(p.x.size());
        for (int64_t i = 0; i < m; ++i) {
          std::memcpy(&rotated_x[(i + 5) % m * p.x_stride()], &p.x[i * p.x_stride()],
                      p.x_stride() * sizeof(float));
        }
        std::vector<float> rotated_y(base.size());
        Matmul(p.Args(rotated_x.data(), m, rotated_y.data()), &pool3);
        for (int64_t i = 0; i < m; ++i) {
          for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool2}) {
            std::vector<float> alone(static_cast<size_t>(p.n));
            Matmul(p.Args(&p.x[i * p.x_stride()], 1, alone.data()), pool);
            ASSERT_EQ(0, std::memcmp(alone.data(), &base[i * p.y_stride()], p.n * sizeof(float)))
                << "row " << i << " alone";
          }
          ASSERT_EQ(0, std::memcmp(&rotated_y[(i + 5) % m * p.y_stride()], &base[i * p.y_stride()],
                                   p.n * sizeof(float)))
              << "row " << i << " moved";
        }
      }
    }
  }
}

// A weight row computed alone (n = 1: one-column tiles) gives the same bits as inside wider tiles,
// whose horizontal sums are shared between columns (HorizontalSum4 in the SIMD paths).
TEST(MatmulTest, EachColumnAloneGivesTheSameBits) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kQ8_0}) {
    for (int64_t m : {1, 2, 5, 13}) {
      const Problem p(m, 13, 1024, dtype, true, 21);
      for (const MatmulPath& path : MatmulPaths()) {
        const ScopedPath scoped(path);
        SCOPED_TRACE(std::string(DTypeName(dtype)) + " " + path.Name() + " m=" + std::to_string(m));
        const std::vector<float> all = p.Run(nullptr);
        const int64_t row_bytes = DTypeRowBytes(dtype, p.k);
        for (int64_t j = 0; j < p.n; ++j) {
          std::vector<float> one(static_cast<size_t>(m));
          const MatmulArgs args{p.x.data(),
                                p.x_stride(),
                                p.w.data() + j * row_bytes,
                                dtype,
                                &p.bias[j],
                                one.data(),
                                1,
                                m,
                                1,
                                p.k};
          Matmul(args, nullptr);
          for (int64_t i = 0; i < m; ++i) {
            ASSERT_EQ(0, std::memcmp(&one[i], &all[i * p.y_stride() + j], sizeof(float)))
                << "row " << i << " col " << j;
          }
        }
      }
    }
  }
}

// Batched float matmuls read the weight rows where they lie when k is a multiple of the converter
// step (kInPlace panels in matmul_panel.inc): weights at any address (a GGUF file aligns tensors to
// 32 bytes only; here 2, 4 and 36 bytes past a 64-byte boundary) give the panel tiles the bits of
// the same weights aligned (k = 1030: the converted panel, whose rows are read unaligned too).
TEST(MatmulTest, BatchedFloatWeightsAtAnyAddressGiveTheSameBits) {
  ThreadPool pool(2);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t k : {int64_t{64}, int64_t{1024}, int64_t{1030}}) {
      const Problem p(13, 21, k, dtype, true, 17);
      for (const MatmulPath& path : MatmulPaths()) {
        const ScopedPath scoped(path);
        SCOPED_TRACE(std::string(DTypeName(dtype)) + " " + path.Name() + " k=" + std::to_string(k));
        const std::vector<float> aligned = p.Run(&pool);
        ExpectMatchesReference(p, aligned);
        for (size_t offset : {size_t{2}, size_t{4}, size_t{36}}) {
          if (offset % DTypeRowBytes(dtype, 1) != 0) continue;  // elements stay whole
          std::vector<uint8_t> buffer(p.w.size() + 128);
          const size_t start = (64 - reinterpret_cast<uintptr_t>(buffer.data()) % 64) % 64 + offset;
          std::memcpy(buffer.data() + start, p.w.data(), p.w.size());
          std::vector<float> y(aligned.size(), -7.0f);
          MatmulArgs args = p.Args(p.x.data(), p.m, y.data());
          args.w = buffer.data() + start;
          Matmul(args, &pool);
          ASSERT_EQ(0, std::memcmp(y.data(), aligned.data(), y.size() * sizeof(float)))
              << "weights " << offset << " bytes past a 64-byte boundary";
        }
      }
    }
  }
}

// A batch's weight panels end in register tiles narrower than the full one (matmul_panel.inc:
// kPanelTileCols<K> wide, then each narrower width for the rest): 16-column panels with 4-wide
// tiles on AVX-512, 24-column panels with 3-wide (f32, f16) and 2-wide (bf16) tiles on AVX2. Panel
// widths n = 22 to 26 and 40 end in tails of every width on both; each must give every row the
// bits of that row alone (the decode tiles) and the reference product.
TEST(MatmulTest, PanelTailsOfEveryWidthGiveTheSameBits) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t n : {22, 23, 24, 25, 26, 40}) {
      const Problem p(9, n, 64, dtype, true, static_cast<uint32_t>(n));
      for (const MatmulPath& path : MatmulPaths()) {
        const ScopedPath scoped(path);
        SCOPED_TRACE(std::string(DTypeName(dtype)) + " " + path.Name() + " n=" + std::to_string(n));
        const std::vector<float> y = p.Run(nullptr);
        ExpectMatchesReference(p, y);
        for (int64_t row = 0; row < p.m; ++row) {
          std::vector<float> alone(static_cast<size_t>(p.n));
          Matmul(p.Args(&p.x[row * p.x_stride()], 1, alone.data()), nullptr);
          ASSERT_EQ(0, std::memcmp(alone.data(), &y[row * p.y_stride()], p.n * sizeof(float)))
              << "row " << row;
        }
      }
    }
  }
}

// Float weights at 12 or more rows per thread split the rows into one group per thread as well
// as the columns into pieces (RowGroups in matmul.cc); a thread may take pieces of several groups
// in one call, and must not reuse one group's converted x rows for another.
TEST(MatmulTest, RowGroupsGiveTheSameBits) {
  ThreadPool pool2(2), pool3(3);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t m : {24, 25, 37, 40}) {
      const Problem p(m, 48, 96, dtype, true, static_cast<uint32_t>(m));
      for (const MatmulPath& path : MatmulPaths()) {
        const ScopedPath scoped(path);
        SCOPED_TRACE(std::string(DTypeName(dtype)) + " " + path.Name() + " m=" + std::to_string(m));
        const std::vector<float> base = p.Run(nullptr);
        ExpectMatchesReference(p, base);
        for (ThreadPool* pool : {&pool2, &pool3}) {
          for (int rep = 0; rep < 4; ++rep) {  // claims of pieces differ between runs
            const std::vector<float> y = p.Run(pool);
            ASSERT_EQ(0, std::memcmp(y.data(), base.data(), y.size() * sizeof(float)))
                << pool->num_threads() << " threads";
          }
        }
      }
    }
  }
}

TEST(MatmulTest, LargeBatchUsesRowBlocksWithoutChangingResults) {
  // q8_0: m = 70 rows span two of the int8 path's 64-row blocks (matmul_int8.inc). Float formats:
  // m = 300 rows span two row blocks of the panel path (kPanelMaxRowBlock in matmul_panel.inc), and
  // k = 4102 several k slices on every path (kPanelKBlock), the last a zero-padded partial vector;
  // n = 40 columns are enough for two threads, each converting every row block anew for each of
  // its pieces.
  const Problem problems[] = {{70, 9, 4096, DType::kQ8_0, false, 3},
                              {300, 40, 4102, DType::kF32, true, 4},
                              {300, 40, 4102, DType::kBF16, false, 5}};
  ThreadPool pool(2);
  for (const Problem& p : problems) {
    for (const MatmulPath& path : MatmulPaths()) {
      const ScopedPath scoped(path);
      SCOPED_TRACE(std::string(DTypeName(p.dtype)) + " " + path.Name());
      const std::vector<float> y = p.Run(&pool);
      ExpectMatchesReference(p, y);
      for (int64_t row : {int64_t{0}, p.m / 2, p.m - 1}) {
        std::vector<float> alone(static_cast<size_t>(p.n));
        Matmul(p.Args(&p.x[row * p.x_stride()], 1, alone.data()), nullptr);
        EXPECT_EQ(0, std::memcmp(alone.data(), &y[row * p.y_stride()], p.n * sizeof(float)))
            << "row " << row;
      }
    }
  }
}

// The int8 activations cost accuracy against the unquantized product only within their rounding:
// |x - d q| <= d / 2 per element, so |error| <= sum_e |w_e| d_block(e) / 2 (+ fp32 summation).
TEST(MatmulTest, Int8ActivationErrorIsWithinHalfAStep) {
  for (DType dtype : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    const Problem p(3, 33, 4096, dtype, false, 21);
    const int64_t block = ScaleBlock(dtype);
    for (const MatmulPath& path : MatmulPaths()) {
      const ScopedPath scoped(path);
      const std::vector<float> y = p.Run(nullptr);
      for (int64_t i = 0; i < p.m; ++i) {
        const float* x = &p.x[i * p.x_stride()];
        for (int64_t j = 0; j < p.n; ++j) {
          double exact = 0.0, bound = 0.0, sum_abs = 0.0;
          for (int64_t b = 0; b < p.k / block; ++b) {
            float amax = 0.0f;
            for (int64_t e = 0; e < block; ++e) amax = std::max(amax, std::fabs(x[b * block + e]));
            for (int64_t e = 0; e < block; ++e) {
              const double w = p.w_ref[j * p.k + b * block + e];
              exact += x[b * block + e] * w;
              bound += std::fabs(w) * amax / 127.0 / 2.0;
              sum_abs += std::fabs(x[b * block + e] * w);
            }
          }
          ASSERT_NEAR(y[i * p.y_stride() + j], exact, bound + 2e-5 * sum_abs)
              << DTypeName(dtype) << " " << path.Name() << " row " << i << " col " << j;
        }
      }
    }
  }
}

// The AVX-512 path with and without VNNI: q4_0 takes different kernels (512-bit vpdpbusd on block
// quads, or 256-bit vpmaddubsw), each matching the reference and each batch-invariant; q8_0 (one
// tile, vpdpbusd or vpmaddubsw for the same exact sums) and the K-quants give identical bits.
TEST(MatmulTest, Avx512WithAndWithoutVnni) {
  if (!CpuSupportsIsa(CpuIsa::kAvx512)) {
    GTEST_SKIP() << "no AVX-512 on this CPU"
                 << testing_ci::DeclaredCiSkip("CI machines may lack it");
  }
  SetAvx512VnniOverride(true);
  if (!CpuAvx512VnniEnabled()) {
    SetAvx512VnniOverride(std::nullopt);
    GTEST_SKIP() << "no AVX-512 VNNI on this CPU"
                 << testing_ci::DeclaredCiSkip("CI machines may lack it");
  }
  const ScopedIsa scoped(CpuIsa::kAvx512);
  for (DType dtype : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    // k = 1024 and block counts that leave 1, 2 and 3 blocks after the q4_0 VNNI kernel's steps
    // of four blocks: 9, 10 and 11 blocks of 32.
    std::vector<int64_t> ks = {1024, 768};
    if (DTypeBlockElems(dtype) == 32) ks = {1024, 288, 320, 352};
    for (int64_t k : ks) {
      for (int64_t m : {1, 5, 70}) {
        SCOPED_TRACE(std::string(DTypeName(dtype)) + " m=" + std::to_string(m) +
                     " k=" + std::to_string(k));
        const Problem p(m, 37, k, dtype, true, 5);
        SetAvx512VnniOverride(true);
        const std::vector<float> vnni = p.Run(nullptr);
        ExpectMatchesReference(p, vnni);
        std::vector<float> alone(static_cast<size_t>(p.n));
        Matmul(p.Args(&p.x[(m - 1) * p.x_stride()], 1, alone.data()), nullptr);
        EXPECT_EQ(0, std::memcmp(alone.data(), &vnni[(m - 1) * p.y_stride()], p.n * sizeof(float)));
        SetAvx512VnniOverride(false);
        const std::vector<float> plain = p.Run(nullptr);
        ExpectMatchesReference(p, plain);
        if (dtype != DType::kQ4_0) {
          EXPECT_EQ(0, std::memcmp(vnni.data(), plain.data(), vnni.size() * sizeof(float)));
        }
      }
    }
  }
  SetAvx512VnniOverride(std::nullopt);
}

// bf16 weights on the AVX-512 path with AVX512_BF16: x rounded to bf16, then vdpbf16ps. Off, the
// weights are widened to fp32 against x as given. Each matches its reference, and each keeps a
// row's bits whatever the batch (decode tiles for m < 4, panels above; k = 1024 reads the weights
// in place, the others partial steps of a converted panel and masked decode steps).
TEST(MatmulTest, Avx512WithAndWithoutBf16Dot) {
  if (!CpuSupportsIsa(CpuIsa::kAvx512)) {
    GTEST_SKIP() << "no AVX-512 on this CPU"
                 << testing_ci::DeclaredCiSkip("CI machines may lack it");
  }
  SetAvx512Bf16Override(true);
  if (!CpuAvx512Bf16Enabled()) {
    SetAvx512Bf16Override(std::nullopt);
    GTEST_SKIP() << "no AVX512_BF16 on this CPU"
                 << testing_ci::DeclaredCiSkip("CI machines may lack it");
  }
  const ScopedIsa scoped(CpuIsa::kAvx512);
  ThreadPool pool(2);
  for (int64_t k : {1024, 33, 80, 1030}) {
    for (int64_t m : {1, 3, 5, 70}) {
      SCOPED_TRACE("m=" + std::to_string(m) + " k=" + std::to_string(k));
      const Problem p(m, 37, k, DType::kBF16, true, 6);
      for (bool dot : {true, false}) {
        SetAvx512Bf16Override(dot);
        ASSERT_EQ(internal::RoundsXToBf16(DType::kBF16), dot);
        const std::vector<float> y = p.Run(&pool);
        ExpectMatchesReference(p, y);
        for (int64_t row : {int64_t{0}, m - 1}) {
          std::vector<float> alone(static_cast<size_t>(p.n));
          Matmul(p.Args(&p.x[row * p.x_stride()], 1, alone.data()), nullptr);
          EXPECT_EQ(0, std::memcmp(alone.data(), &y[row * p.y_stride()], p.n * sizeof(float)))
              << "row " << row << (dot ? " with" : " without") << " the bf16 dot product";
        }
      }
      // Rounding x is the only difference: x already in bf16 gives the same bits both ways.
      Problem exact = p;
      for (float& v : exact.x) v = RoundToBf16(v);
      SetAvx512Bf16Override(true);
      const std::vector<float> with = exact.Run(nullptr);
      SetAvx512Bf16Override(false);
      const std::vector<float> without = exact.Run(nullptr);
      for (size_t i = 0; i < with.size(); ++i) {
        ASSERT_NEAR(with[i], without[i], 1e-5 * (1.0 + std::fabs(without[i]))) << "element " << i;
      }
    }
  }
  SetAvx512Bf16Override(std::nullopt);
}

// The q8_0 and K-quant tiles are one 256-bit source each on every x86 path (matmul_int8.inc) with
// exact integer sums, so AVX2 and AVX-512 (with VNNI where the CPU has it) give the same bits, in
// decode tiles (m < 4: eight weight rows per tile) and batched ones.
TEST(MatmulTest, Q8AndKQuantsGiveTheSameBitsOnEveryX86Path) {
  if (!CpuSupportsIsa(CpuIsa::kAvx512)) {
    GTEST_SKIP() << "no AVX-512 on this CPU"
                 << testing_ci::DeclaredCiSkip("CI machines may lack it");
  }
  for (DType dtype : {DType::kQ8_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    for (int64_t m : {1, 3, 6}) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " m=" + std::to_string(m));
      const Problem p(m, 37, 1024, dtype, true, 13);
      std::vector<float> avx2, avx512;
      {
        const ScopedIsa scoped(CpuIsa::kAvx2);
        avx2 = p.Run(nullptr);
      }
      {
        const ScopedIsa scoped(CpuIsa::kAvx512);
        avx512 = p.Run(nullptr);
      }
      ExpectMatchesReference(p, avx2);
      EXPECT_EQ(0, std::memcmp(avx2.data(), avx512.data(), avx2.size() * sizeof(float)));
    }
  }
}

// The SIMD activation quantizer gives the portable one's bits: random rows, a zero block, exact
// ties (x / d = n + 0.5), values at +-max, and scale blocks of 32 and 256.
TEST(MatmulTest, SimdActivationQuantizerMatchesPortable) {
  if (!CpuSupportsIsa(CpuIsa::kAvx2)) {
    GTEST_SKIP() << "no AVX2 on this CPU" << testing_ci::DeclaredCiSkip("CI machines may lack it");
  }
  for (int64_t scale_block : {int64_t{32}, int64_t{256}}) {
    const int64_t k = 1024;
    std::mt19937 rng(3);
    std::vector<float> x = RandomFloats(static_cast<size_t>(k), rng);
    for (int64_t i = 0; i < scale_block; ++i) x[static_cast<size_t>(scale_block + i)] = 0.0f;
    for (int64_t i = 0; i < scale_block; ++i) {  // max 127: every n + 0.5 is a tie
      x[static_cast<size_t>(2 * scale_block + i)] =
          i == 0 ? 127.0f : static_cast<float>(i % 254 - 127) + 0.5f;
    }
    x[static_cast<size_t>(3 * scale_block)] = -5.0e4f;
    std::vector<int8_t> q_ref(static_cast<size_t>(k)), q_simd(static_cast<size_t>(k));
    std::vector<float> d_ref(static_cast<size_t>(k / scale_block)), d_simd(d_ref.size());
    std::vector<int32_t> s_ref(static_cast<size_t>(k / 32)), s_simd(s_ref.size());
    internal::QuantizeActivationRow(x.data(), k, scale_block, q_ref.data(), d_ref.data(),
                                    s_ref.data());
    internal::QuantizeActivationRowAvx2(x.data(), k, scale_block, q_simd.data(), d_simd.data(),
                                        s_simd.data());
    EXPECT_EQ(q_ref, q_simd) << "scale block " << scale_block;
    EXPECT_EQ(0, std::memcmp(d_ref.data(), d_simd.data(), d_ref.size() * sizeof(float)));
    EXPECT_EQ(s_ref, s_simd);
    EXPECT_EQ(d_ref[1], 0.0f);
    EXPECT_EQ(q_ref[static_cast<size_t>(2 * scale_block + 1)], -126);  // -126.5 to even
  }
}

TEST(MatmulTest, EmptyShapesDoNothing) {
  float y = 5.0f;
  const float x = 1.0f;
  const float w = 2.0f;
  Matmul(MatmulArgs{&x, 1, &w, DType::kF32, nullptr, &y, 1, 0, 1, 1}, nullptr);
  Matmul(MatmulArgs{&x, 1, &w, DType::kF32, nullptr, &y, 1, 1, 0, 1}, nullptr);
  EXPECT_EQ(y, 5.0f);
}

}  // namespace
}  // namespace kvserve::cpu
